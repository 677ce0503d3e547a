from strtools.shorten import truncate


def test_result_within_limit():
    out = truncate("The quick brown fox", 10)
    assert out == "The qui..." and len(out) == 10


def test_custom_ellipsis():
    assert truncate("abcdefghij", 5, ellipsis="~") == "abcd~"


def test_exact_length_unchanged():
    assert truncate("abcde", 5) == "abcde"


def test_limit_equals_ellipsis():
    assert truncate("abcdef", 3) == "..."
