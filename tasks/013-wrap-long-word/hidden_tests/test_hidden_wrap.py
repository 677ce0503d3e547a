from layout.wrap import wrap, fill


def test_long_first_word():
    assert wrap("supercalifragilistic is long", 10) == ["supercalifragilistic", "is long"]


def test_exact_width_first_word():
    assert wrap("abcde fg", 5) == ["abcde", "fg"]


def test_no_blank_lines():
    assert "" not in wrap("x " * 20, 4)


def test_long_word_in_middle():
    assert wrap("hi extraordinarily ok", 6) == ["hi", "extraordinarily", "ok"]


def test_fill_long_word():
    assert fill("abcdefgh", 3) == "abcdefgh"
