from timing.stopwatch import Stopwatch


class Fake:
    t = 0.0

    def __call__(self):
        return self.t


def session():
    f = Fake()
    sw = Stopwatch(clock=f)
    sw.start()
    f.t = 3
    sw.lap()
    f.t = 5
    sw.lap()
    sw.reset()
    sw.start()
    f.t = 6
    sw.lap()
    return sw, f


def test_laps_cleared():
    sw, _ = session()
    assert sw.laps == [1]


def test_fastest_after_reset():
    f = Fake()
    sw = Stopwatch(clock=f)
    sw.start()
    f.t = 1
    sw.lap()
    sw.reset()
    f.t = 10
    sw.start()
    f.t = 14
    sw.lap()
    assert sw.fastest_lap() == 4


def test_elapsed_after_reset():
    sw, f = session()
    f.t = 8
    assert sw.elapsed() == 3


def test_reset_then_idle():
    sw, _ = session()
    sw.reset()
    assert sw.elapsed() == 0.0 and sw.fastest_lap() is None
