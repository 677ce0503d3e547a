from decimal import Decimal
from shopfmt.fmt import format_amount, quantize
from shopfmt.currencies import decimals


def test_yen_no_decimals():
    assert format_amount(1234, "JPY") == "JPY 1,234"


def test_yen_minor_units():
    assert decimals("jpy") == 0


def test_dinar_three_decimals():
    assert format_amount(1.2345, "KWD") == "KWD 1.235"


def test_usd_unchanged():
    assert format_amount(0.005, "USD") == "USD 0.01"


def test_quantize_eur():
    assert quantize("2.675", "EUR") == Decimal("2.68")
