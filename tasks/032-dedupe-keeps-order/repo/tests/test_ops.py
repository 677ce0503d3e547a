from listutil.ops import unique, flatten


def test_same_elements():
    assert sorted(unique([3, 1, 3, 2, 1])) == [1, 2, 3]


def test_key():
    assert unique(["A", "b", "a", "B"], key=str.lower) == ["A", "b"]


def test_flatten():
    assert flatten([[1], [2, 3]]) == [1, 2, 3]
