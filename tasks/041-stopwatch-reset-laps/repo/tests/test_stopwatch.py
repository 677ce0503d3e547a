import pytest
from timing.stopwatch import Stopwatch


class Fake:
    t = 0.0

    def __call__(self):
        return self.t


def test_laps():
    f = Fake()
    sw = Stopwatch(clock=f)
    sw.start()
    f.t = 2
    sw.lap()
    f.t = 7
    assert sw.lap() == 5 and sw.laps == [2, 5] and sw.fastest_lap() == 2


def test_not_running():
    with pytest.raises(RuntimeError):
        Stopwatch().lap()
