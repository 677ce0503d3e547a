from datetime import date
import pytest
from weeks.util import week_start


def test_monday_weeks():
    assert week_start(date(2024, 5, 15)) == date(2024, 5, 13)


def test_bad_weekday():
    with pytest.raises(ValueError):
        week_start(date(2024, 1, 1), 7)
