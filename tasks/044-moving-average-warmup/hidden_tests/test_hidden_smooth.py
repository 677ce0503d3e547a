from signals.smooth import moving_average


def test_warmup_constant():
    assert moving_average([10, 10, 10, 10], 3) == [10.0, 10.0, 10.0, 10.0]


def test_warmup_values():
    assert moving_average([2, 4, 6, 8], 3) == [2.0, 3.0, 4.0, 6.0]


def test_empty():
    assert moving_average([], 5) == []


def test_window_larger_than_data():
    assert moving_average([1, 3], 10) == [1.0, 2.0]


def test_window_one_floats():
    assert moving_average([1.5, 2.5], 1) == [1.5, 2.5]
