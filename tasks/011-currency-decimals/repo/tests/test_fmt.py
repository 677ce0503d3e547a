from shopfmt.fmt import format_amount
from shopfmt.currencies import decimals, is_known


def test_eur():
    assert format_amount(1234.5, "eur") == "EUR 1,234.50"


def test_known():
    assert is_known("usd") and not is_known("XYZ")
    assert decimals("KWD") == 3
