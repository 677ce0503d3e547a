from releases.versions import latest, sort_versions


def test_two_digit_minor():
    assert latest(["1.9.0", "1.10.0", "1.2.3"]) == "1.10.0"


def test_sort_major():
    assert sort_versions(["2.0", "10.0", "9.1"]) == ["2.0", "9.1", "10.0"]


def test_prefix_v():
    assert latest(["v2.1", "v2.0.9"]) == "v2.1"


def test_shorter_is_older():
    assert sort_versions(["1.0.1", "1.0"]) == ["1.0", "1.0.1"]
