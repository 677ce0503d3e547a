"""The process's compute thread (orchestrator/compute_thread.py): every engine and trainer share
it, so nothing one of them does wrong may end it."""
from __future__ import annotations

import threading
import time

import pytest
from orchestrator.compute_thread import ComputeThread


def test_a_loop_step_that_raises_leaves_the_thread_serving():
    compute = ComputeThread()
    calls: list[int] = []

    def step() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in a scheduler step")
        return False

    compute.add_loop(step)
    assert compute.submit(lambda: 42).result(timeout=10) == 42
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    compute.remove_loop(step)
    assert len(calls) >= 3  # the step runs on after its fault


def test_a_step_that_keeps_failing_is_logged_ever_more_rarely():
    """Its 1st, 2nd, 4th, 8th... fault in a row, with the count: a broken step retried 20 times a
    second must not flood the log. A success resets the count."""
    from structlog.testing import capture_logs

    compute = ComputeThread()
    calls: list[int] = []

    def step() -> bool:
        calls.append(1)
        if len(calls) <= 10 or 12 <= len(calls) <= 13:  # ten faults, a success, two more
            raise RuntimeError("still broken")
        return False

    with capture_logs() as logs:
        compute.add_loop(step)
        deadline = time.monotonic() + 20
        while len(calls) < 15 and time.monotonic() < deadline:
            time.sleep(0.01)
        compute.remove_loop(step)
    assert [e["failures"] for e in logs if e["event"] == "compute.loop_failed"] == [1, 2, 4, 8, 1, 2]


def test_a_removed_step_leaves_no_count_behind():
    """The count is keyed by the step, a bound method holding its engine: removing the step lets
    the engine go."""
    compute = ComputeThread()
    failed: list[int] = []

    def broken() -> bool:
        failed.append(1)
        raise RuntimeError("broken")

    compute.add_loop(broken)
    deadline = time.monotonic() + 10
    while not failed and time.monotonic() < deadline:
        time.sleep(0.01)
    compute.remove_loop(broken)
    assert compute.submit(lambda: 1).result(timeout=10) == 1  # an iteration after the removal
    assert compute.submit(lambda: dict(compute._failures)).result(timeout=10) == {}


def test_a_job_cancelled_while_it_waits_is_not_run_and_the_thread_serves_on():
    """A caller gone while its job queued (a cancelled rollout awaiting the trainer's future)
    cancels the future: the job is skipped, and the jobs after it still run."""
    import threading

    compute = ComputeThread()
    release, ran = threading.Event(), []
    busy = compute.submit(release.wait, 10)
    waiting = compute.submit(lambda: ran.append("cancelled job"))
    assert waiting.cancel()
    release.set()
    assert busy.result(timeout=10) is True
    assert compute.submit(lambda: 7).result(timeout=10) == 7
    assert ran == [] and waiting.cancelled()


def test_queued_jobs_run_back_to_back_while_the_loops_are_idle():
    """A job is work: the thread looks for the next at once rather than waiting out its 50 ms
    idle pause after each (40 queued training jobs took 2 s behind an idle engine's step)."""
    compute = ComputeThread()
    waited_on: list[int] = []  # jobs queued at each idle pause

    class Watched(threading.Event):
        def wait(self, timeout=None):
            if timeout is not None and not compute._jobs.empty():
                waited_on.append(compute._jobs.qsize())
            return super().wait(timeout)

    compute._wake = Watched()
    gate = threading.Event()
    first = compute.submit(gate.wait, 10)  # holds the thread while the rest queue behind it
    idle = lambda: False  # noqa: E731 - an engine with nothing to do
    compute.add_loop(idle)
    jobs = [compute.submit(int) for _ in range(40)]
    gate.set()
    assert first.result(timeout=30) is True and [job.result(timeout=30) for job in jobs] == [0] * 40
    compute.remove_loop(idle)
    assert waited_on == []


def test_a_job_that_raises_a_base_exception_hands_it_to_its_caller_and_the_thread_serves_on():
    """A job's SystemExit or KeyboardInterrupt (no Exception) would end the thread every engine and
    trainer shares: each later future would wait for ever."""
    compute = ComputeThread()

    def exits() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        compute.submit(exits).result(timeout=10)
    assert compute.submit(lambda: 5).result(timeout=10) == 5
