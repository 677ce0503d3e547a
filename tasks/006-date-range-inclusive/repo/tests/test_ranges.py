from datetime import date
import pytest
from cal.ranges import date_range


def test_empty_when_end_before_start():
    assert list(date_range(date(2024, 1, 5), date(2024, 1, 1))) == []


def test_bad_step():
    with pytest.raises(ValueError):
        list(date_range(date(2024, 1, 1), date(2024, 1, 2), step=0))
