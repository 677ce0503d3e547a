from listutil.ops import unique


def test_order_kept():
    assert unique([30, 20, 30, 10]) == [30, 20, 10]


def test_numbers_order():
    assert unique([5, 3, 5, 1, 3, 9]) == [5, 3, 1, 9]


def test_key_first_wins():
    assert unique(["Bob", "alice", "BOB"], key=str.lower) == ["Bob", "alice"]


def test_empty():
    assert unique([]) == []
