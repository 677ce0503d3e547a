"""The process's compute thread (orchestrator/compute_thread.py): every engine and trainer share
it, so nothing one of them does wrong may end it."""
from __future__ import annotations

import time

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
