from datetime import date
from people.age import age_on, is_adult


def test_before_birthday():
    assert age_on(date(2000, 12, 25), date(2024, 6, 1)) == 23


def test_on_birthday():
    assert age_on(date(2000, 6, 1), date(2024, 6, 1)) == 24


def test_day_before_birthday():
    assert age_on(date(2000, 6, 2), date(2024, 6, 1)) == 23


def test_minor_not_adult():
    assert not is_adult(date(2006, 12, 31), date(2024, 6, 1))


def test_adult():
    assert is_adult(date(2006, 1, 1), date(2024, 6, 1))
