import pytest
from spans.intervals import merge


def test_overlap():
    assert merge([(2, 6), (1, 4)]) == [(1, 6)]


def test_bad():
    with pytest.raises(ValueError):
        merge([(3, 1)])
