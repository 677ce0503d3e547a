import pytest
from datesy.calendar import is_leap, days_in_month


def test_simple_leap():
    assert is_leap(2024) and not is_leap(2023)


def test_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2024, 13)
