from limits.ratelimit import RateLimiter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_allows_again_after_window():
    c = Clock()
    rl = RateLimiter(2, 10, clock=c)
    for _ in range(3):
        rl.allow("bob")
    c.now = 11
    assert rl.allow("bob") is True


def test_remaining_resets():
    c = Clock()
    rl = RateLimiter(3, 5, clock=c)
    rl.allow("x")
    rl.allow("x")
    c.now = 5
    assert rl.remaining("x") == 3


def test_still_blocked_inside_window():
    c = Clock()
    rl = RateLimiter(1, 10, clock=c)
    rl.allow("a")
    c.now = 9.9
    assert rl.allow("a") is False


def test_remaining_counts_down():
    rl = RateLimiter(3, 10, clock=Clock())
    rl.allow("z")
    assert rl.remaining("z") == 2
