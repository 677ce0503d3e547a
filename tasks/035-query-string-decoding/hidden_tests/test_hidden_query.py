from webbits.query import parse_query, first


def test_plus_is_space():
    assert parse_query("q=hello+world") == {"q": ["hello world"]}


def test_percent_utf8():
    assert first("city=S%C3%A3o%20Paulo", "city") == "São Paulo"


def test_encoded_key():
    assert parse_query("first%20name=Ann") == {"first name": ["Ann"]}


def test_encoded_ampersand_in_value():
    assert parse_query("x=a%26b&y=1") == {"x": ["a&b"], "y": ["1"]}


def test_plain_still_fine():
    assert parse_query("a=1&&b=") == {"a": ["1"], "b": [""]}
