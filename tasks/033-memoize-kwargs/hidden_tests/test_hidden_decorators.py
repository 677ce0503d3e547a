from memo.decorators import memoize


def test_kwargs_distinguish():
    @memoize
    def greet(name, punctuation="."):
        return f"Hello {name}{punctuation}"

    assert greet("Ann") == "Hello Ann."
    assert greet("Ann", punctuation="!") == "Hello Ann!"


def test_kwargs_order_irrelevant():
    calls = []

    @memoize
    def f(a=0, b=0):
        calls.append(1)
        return a - b

    assert f(a=1, b=2) == -1
    assert f(b=2, a=1) == -1
    assert len(calls) == 1


def test_cache_clear():
    calls = []

    @memoize
    def g(x):
        calls.append(x)
        return x

    g(1)
    g.cache_clear()
    g(1)
    assert calls == [1, 1]


def test_positional_still_cached():
    calls = []

    @memoize
    def h(x, y):
        calls.append(1)
        return x + y

    h(1, 2)
    h(1, 2)
    assert len(calls) == 1
