from numbox.stats import median, summary


def test_even():
    assert median([1, 2, 3, 4]) == 2.5


def test_even_unsorted():
    assert median([10, 40, 20, 30]) == 25


def test_two_values():
    assert median([7, 8]) == 7.5


def test_odd_still_fine():
    assert median([5, 1, 9, 3, 7]) == 5


def test_summary():
    assert summary([1, 2, 3, 4]) == {"n": 4, "mean": 2.5, "median": 2.5, "range": 3}
