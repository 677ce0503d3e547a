from datetime import date
from weeks.util import week_start, week_days


def test_sunday_weeks_wednesday():
    assert week_start(date(2024, 5, 15), first_weekday=6) == date(2024, 5, 12)


def test_sunday_itself():
    assert week_start(date(2024, 5, 12), first_weekday=6) == date(2024, 5, 12)


def test_saturday_in_sunday_week():
    assert week_start(date(2024, 5, 18), first_weekday=6) == date(2024, 5, 12)


def test_week_days_sunday():
    days = week_days(date(2024, 5, 15), 6)
    assert days[0] == date(2024, 5, 12) and days[-1] == date(2024, 5, 18)


def test_monday_default_on_sunday():
    assert week_start(date(2024, 5, 19)) == date(2024, 5, 13)
