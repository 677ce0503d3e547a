import pytest
from kvstore.writer import dumps
from kvstore.reader import loads


def test_round_trip_plain():
    data = {"a": "1", "b": "hello world"}
    assert loads(dumps(data)) == data


def test_sorted_output():
    assert dumps({"b": "2", "a": "1"}) == "a\t1\nb\t2\n"


def test_bad_key():
    with pytest.raises(ValueError):
        dumps({"a\tb": "x"})
