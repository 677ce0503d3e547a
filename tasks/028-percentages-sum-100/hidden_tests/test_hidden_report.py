from survey.report import as_percentages


def test_thirds_sum_100():
    got = as_percentages({"yes": 1, "no": 1, "maybe": 1})
    assert got == {"yes": 34, "no": 33, "maybe": 33}


def test_six_options_sum_100():
    got = as_percentages({"a": 2, "b": 2, "c": 2, "d": 1, "e": 1, "f": 1})
    assert sum(got.values()) == 100
    assert got == {"a": 22, "b": 22, "c": 22, "d": 11, "e": 11, "f": 12} or \
        got == {"a": 23, "b": 22, "c": 22, "d": 11, "e": 11, "f": 11}


def test_exact_shares():
    assert as_percentages({"x": 3, "y": 1}) == {"x": 75, "y": 25}


def test_single_option():
    assert as_percentages({"only": 7}) == {"only": 100}
