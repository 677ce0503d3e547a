import pytest
from confy.parser import parse_config, ConfigSyntaxError


def test_equals_in_value():
    got = parse_config("[db]\nurl = postgres://host/db?sslmode=require\n")
    assert got == {"db": {"url": "postgres://host/db?sslmode=require"}}


def test_base64_padding():
    assert parse_config("[k]\ntoken = YWJj==\n")["k"]["token"] == "YWJj=="


def test_empty_value():
    assert parse_config("[s]\nname =\n") == {"s": {"name": ""}}


def test_missing_equals():
    with pytest.raises(ConfigSyntaxError):
        parse_config("[s]\nnonsense\n")
