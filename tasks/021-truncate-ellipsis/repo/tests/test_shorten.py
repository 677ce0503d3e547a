import pytest
from strtools.shorten import truncate, truncate_words


def test_fits():
    assert truncate("short", 10) == "short"


def test_limit_too_small():
    with pytest.raises(ValueError):
        truncate("abc", 2)


def test_words():
    assert truncate_words("a b c d", 2) == "a b ..."
