import pytest
from datesy.calendar import is_leap, days_in_month, day_of_year


def test_1900_not_leap():
    assert not is_leap(1900)


def test_2000_leap():
    assert is_leap(2000)


def test_feb_2100():
    assert days_in_month(2100, 2) == 28


def test_day_of_year_2100():
    assert day_of_year(2100, 3, 1) == 60


def test_feb_29_1900_invalid():
    with pytest.raises(ValueError):
        day_of_year(1900, 2, 29)


def test_day_of_year_2024():
    assert day_of_year(2024, 12, 31) == 366
