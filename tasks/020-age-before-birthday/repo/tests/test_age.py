from datetime import date
import pytest
from people.age import age_on


def test_after_birthday():
    assert age_on(date(1990, 1, 1), date(2020, 6, 1)) == 30


def test_future():
    with pytest.raises(ValueError):
        age_on(date(2030, 1, 1), date(2020, 1, 1))
