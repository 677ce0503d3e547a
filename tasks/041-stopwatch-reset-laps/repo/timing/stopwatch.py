import time


class Stopwatch:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.laps = []
        self._start = None
        self._last = None

    def start(self):
        if self._start is not None:
            raise RuntimeError("already running")
        self._start = self._last = self.clock()

    def lap(self) -> float:
        if self._start is None:
            raise RuntimeError("not running")
        now = self.clock()
        self.laps.append(now - self._last)
        self._last = now
        return self.laps[-1]

    def elapsed(self) -> float:
        return 0.0 if self._start is None else self.clock() - self._start

    def fastest_lap(self):
        return min(self.laps) if self.laps else None

    def reset(self):
        self._start = None
        self._last = None
