import pytest
from numerals.roman import from_roman, to_roman


def test_additive():
    assert from_roman("viii") == 8


def test_to_roman():
    assert to_roman(1994) == "MCMXCIV"


def test_invalid():
    with pytest.raises(ValueError):
        from_roman("ABC")
