import pytest
from signals.smooth import moving_average


def test_window_one():
    assert moving_average([1, 2, 3], 1) == [1, 2, 3]


def test_bad_window():
    with pytest.raises(ValueError):
        moving_average([1], 0)
