from limits.ratelimit import RateLimiter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_limit_within_window():
    rl = RateLimiter(2, 10, clock=Clock())
    assert [rl.allow("k") for _ in range(3)] == [True, True, False]


def test_keys_independent():
    rl = RateLimiter(1, 10, clock=Clock())
    assert rl.allow("a") and rl.allow("b")
