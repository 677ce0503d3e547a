from textkit.slug import slugify, unique_slug


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_max_len():
    assert slugify("a long title here", max_len=6) == "a-long"


def test_unique():
    assert unique_slug("Hi", {"hi", "hi-2"}) == "hi-3"
