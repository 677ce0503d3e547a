import pytest
from resilience.retry import retry


def test_success_first_time():
    assert retry(lambda: 5, sleep=lambda s: None) == 5


def test_non_matching_exception_not_retried():
    calls = []

    def f():
        calls.append(1)
        raise KeyError("x")

    with pytest.raises(KeyError):
        retry(f, exceptions=(ValueError,), sleep=lambda s: None)
    assert len(calls) == 1
