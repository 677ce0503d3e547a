from layout.wrap import wrap, fill


def test_wrap():
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]


def test_empty():
    assert wrap("   ", 5) == []


def test_fill():
    assert fill("a b c", 3) == "a b\nc"
