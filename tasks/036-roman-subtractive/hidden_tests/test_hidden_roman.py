from numerals.roman import from_roman, to_roman


def test_four():
    assert from_roman("IV") == 4


def test_year():
    assert from_roman("MCMXCIV") == 1994


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 400))


def test_big_additive():
    assert from_roman("MMXXIII") == 2023
