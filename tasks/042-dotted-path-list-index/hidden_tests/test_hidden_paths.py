from nested.paths import get_path, has_path

DATA = {"users": [{"name": "Ann"}, {"name": "Bo", "tags": ["x", "y"]}]}


def test_list_index():
    assert get_path(DATA, "users.1.name") == "Bo"


def test_nested_lists():
    assert get_path(DATA, "users.1.tags.0") == "x"


def test_out_of_range_default():
    assert get_path(DATA, "users.5.name", "none") == "none"


def test_non_numeric_on_list():
    assert get_path(DATA, "users.first", 0) == 0


def test_has_path_list():
    assert has_path(DATA, "users.0") and not has_path(DATA, "users.2")
