from gradebook.grades import letter, distribution


def test_exact_a():
    assert letter(90) == "A"


def test_exact_boundaries():
    assert [letter(s) for s in (80, 70, 60)] == ["B", "C", "D"]


def test_just_below():
    assert letter(89.5) == "B"


def test_extremes():
    assert letter(0) == "F" and letter(100) == "A"


def test_distribution():
    d = distribution([90, 90, 59, 60])
    assert d["A"] == 2 and d["F"] == 1 and d["D"] == 1
