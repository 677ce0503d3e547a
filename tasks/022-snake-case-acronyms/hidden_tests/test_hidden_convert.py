from casing.convert import to_snake


def test_leading_acronym():
    assert to_snake("HTTPServer") == "http_server"


def test_middle_acronym():
    assert to_snake("parseJSONResponse") == "parse_json_response"


def test_trailing_acronym():
    assert to_snake("userID") == "user_id"


def test_plain():
    assert to_snake("simple") == "simple"


def test_digits():
    assert to_snake("version2Name") == "version2_name"
