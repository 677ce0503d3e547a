from billing.money import to_cents, format_money, split_evenly


def test_simple():
    assert to_cents("12.34") == 1234


def test_format_negative():
    assert format_money(-3.5, "$") == "-$3.50"


def test_split():
    assert split_evenly(10, 3) == [334, 333, 333]
