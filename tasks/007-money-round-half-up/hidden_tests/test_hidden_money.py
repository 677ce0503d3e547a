from billing.money import to_cents, format_money


def test_half_cent_rounds_up():
    assert to_cents(2.675) == 268


def test_one_point_zero_zero_five():
    assert to_cents(1.005) == 101


def test_format_half():
    assert format_money(0.125) == "0.13"


def test_negative_half_away_from_zero():
    assert to_cents(-0.125) == -13


def test_plain_values():
    assert to_cents(19.99) == 1999
    assert to_cents("0") == 0
