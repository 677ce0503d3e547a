from webbits.query import parse_query, first


def test_repeated():
    assert parse_query("?a=1&b=2&a=3") == {"a": ["1", "3"], "b": ["2"]}


def test_flag():
    assert parse_query("debug") == {"debug": [""]}


def test_first_default():
    assert first("a=1", "z", "none") == "none"
