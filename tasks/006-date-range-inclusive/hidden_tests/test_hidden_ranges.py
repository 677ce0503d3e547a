from datetime import date
from cal.ranges import date_range, count_weekdays


def test_end_included():
    got = list(date_range(date(2024, 3, 1), date(2024, 3, 3)))
    assert got == [date(2024, 3, 1), date(2024, 3, 2), date(2024, 3, 3)]


def test_single_day():
    assert list(date_range(date(2024, 2, 29), date(2024, 2, 29))) == [date(2024, 2, 29)]


def test_workweek():
    assert count_weekdays(date(2024, 3, 4), date(2024, 3, 8)) == 5


def test_step_two():
    got = list(date_range(date(2024, 1, 1), date(2024, 1, 6), step=2))
    assert got == [date(2024, 1, 1), date(2024, 1, 3), date(2024, 1, 5)]


def test_reversed_is_empty():
    assert list(date_range(date(2024, 1, 2), date(2024, 1, 1))) == []
