from datetime import date
from billingcycle.dates import add_months, renewal_dates


def test_jan_31_leap():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)


def test_jan_31_common():
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)


def test_backwards():
    assert add_months(date(2024, 3, 31), -1) == date(2024, 2, 29)


def test_renewals_keep_day_when_possible():
    got = renewal_dates(date(2024, 1, 31), 3)
    assert got == [date(2024, 1, 31), date(2024, 2, 29), date(2024, 3, 31)]


def test_negative_year_wrap():
    assert add_months(date(2024, 1, 10), -1) == date(2023, 12, 10)
