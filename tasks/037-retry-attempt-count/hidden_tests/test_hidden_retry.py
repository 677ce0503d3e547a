import pytest
from resilience.retry import retry


def make(fail_times):
    calls = []

    def f():
        calls.append(1)
        if len(calls) <= fail_times:
            raise ConnectionError("boom")
        return "ok"
    return f, calls


def test_two_retries_three_attempts():
    f, calls = make(2)
    assert retry(f, max_retries=2, sleep=lambda s: None) == "ok"
    assert len(calls) == 3


def test_zero_retries_one_attempt():
    f, calls = make(5)
    with pytest.raises(ConnectionError):
        retry(f, max_retries=0, sleep=lambda s: None)
    assert len(calls) == 1


def test_backoff_delays():
    f, _ = make(3)
    waits = []
    retry(f, max_retries=3, delay=1, backoff=2, sleep=waits.append)
    assert waits == [1, 2, 4]


def test_on_retry_called_per_retry():
    f, _ = make(1)
    seen = []
    retry(f, max_retries=1, sleep=lambda s: None, on_retry=lambda n, e: seen.append(n))
    assert seen == [1]


def test_gives_up():
    f, calls = make(10)
    with pytest.raises(ConnectionError):
        retry(f, max_retries=2, sleep=lambda s: None)
    assert len(calls) == 3
