import pytest
from releases.versions import latest, parse


def test_latest_simple():
    assert latest(["v1.2", "1.3", "1.1"]) == "1.3"


def test_invalid():
    with pytest.raises(ValueError):
        parse("1.x")


def test_empty():
    assert latest([]) is None
