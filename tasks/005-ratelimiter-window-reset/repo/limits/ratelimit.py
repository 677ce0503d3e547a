import time


class RateLimiter:
    """Fixed-window limiter: at most ``limit`` calls per ``window`` seconds per key."""

    def __init__(self, limit, window, clock=time.monotonic):
        self.limit = limit
        self.window = window
        self.clock = clock
        self._start = {}
        self._count = {}

    def _roll(self, key):
        now = self.clock()
        start = self._start.get(key)
        if start is None or now - start >= self.window:
            self._start[key] = now
            self._count.setdefault(key, 0)

    def allow(self, key):
        self._roll(key)
        if self._count[key] >= self.limit:
            return False
        self._count[key] += 1
        return True

    def remaining(self, key):
        self._roll(key)
        return self.limit - self._count[key]
