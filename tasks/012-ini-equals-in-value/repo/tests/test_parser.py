import pytest
from confy.parser import parse_config, ConfigSyntaxError, get_int


def test_basic():
    assert parse_config("[a]\nX = 1\n# c\n") == {"a": {"x": "1"}}


def test_outside_section():
    with pytest.raises(ConfigSyntaxError):
        parse_config("x = 1")


def test_get_int_default():
    assert get_int({}, "a", "b", 7) == 7
