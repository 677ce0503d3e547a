from spans.intervals import merge, total_length, covers


def test_touching_merged():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_covers_across_touch():
    assert covers([(1, 3), (3, 5)], 1, 5)


def test_disjoint_kept():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_total_length():
    assert total_length([(0, 2), (1, 3), (10, 11)]) == 4


def test_contained():
    assert merge([(1, 10), (2, 3), (10, 12)]) == [(1, 12)]
