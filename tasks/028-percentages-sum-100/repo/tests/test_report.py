from survey.report import as_percentages, winner


def test_even_split():
    assert as_percentages({"a": 1, "b": 1}) == {"a": 50, "b": 50}


def test_zero():
    assert as_percentages({"a": 0}) == {"a": 0}


def test_winner():
    assert winner({"a": 1, "b": 3}) == "b"
