from nested.paths import get_path, has_path


def test_dicts():
    assert get_path({"a": {"b": 1}}, "a.b") == 1


def test_missing_default():
    assert get_path({"a": {}}, "a.b", "d") == "d"


def test_has_path_none_value():
    assert has_path({"a": None}, "a")
