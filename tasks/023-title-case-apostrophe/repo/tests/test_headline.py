from press.headline import headline


def test_small_words():
    assert headline("war and peace") == "War and Peace"


def test_first_small_word():
    assert headline("the end") == "The End"
