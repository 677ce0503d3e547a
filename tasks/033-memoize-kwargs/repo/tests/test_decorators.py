from memo.decorators import memoize


def test_caches():
    calls = []

    @memoize
    def sq(x):
        calls.append(x)
        return x * x

    assert sq(3) == 9 and sq(3) == 9 and calls == [3]


def test_wraps():
    @memoize
    def f(x):
        "doc"
        return x
    assert f.__name__ == "f" and f.__doc__ == "doc"
