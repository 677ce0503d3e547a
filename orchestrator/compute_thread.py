"""One OS thread for the heavy torch work of the process: the engine's scheduler and the trainer.

torch's CPU kernels run on OpenMP (libgomp). Between parallel regions libgomp's worker threads
spin for a while before they sleep, which is what keeps a decode step's hundreds of small ops
fast; but as soon as the process holds more OpenMP threads than cores (every OS thread that
runs a large op keeps a team of its own), libgomp throttles that spinning to almost nothing,
for good. Measured on 2 cores: one 10M-element op on a second thread cut the engine's decode
rate from 356 to 231 tok/s for the rest of the process. So the engine's scheduler iterations
and the training client's jobs take turns on this one thread.

    compute = compute_thread()
    future = compute.submit(fn, *args)       # a job, run in submission order
    compute.add_loop(step)                   # step() -> bool (did work), called between jobs
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable

import structlog

log = structlog.get_logger()


class ComputeThread:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._loops: list[Callable[[], bool]] = []
        self._failures: dict[Callable[[], bool], int] = {}  # a loop step's faults in a row (the thread's own)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        self._start()
        return future

    def add_loop(self, step: Callable[[], bool]) -> None:
        """Call ``step`` over and over (it returns whether it did work) until ``remove_loop``."""
        with self._lock:
            self._loops.append(step)
        self._start()

    def remove_loop(self, step: Callable[[], bool]) -> None:
        with self._lock:
            if step in self._loops:
                self._loops.remove(step)

    def wake(self) -> None:
        self._wake.set()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rolecast-compute", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.clear()  # before looking for work: a wake() from now on is not lost
            busy = False
            try:
                future, fn, args = self._jobs.get_nowait()
            except queue.Empty:
                pass
            else:
                busy = True
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:  # noqa: BLE001 - the caller gets it from the future
                        future.set_exception(exc)
            with self._lock:
                loops = list(self._loops)
            for step in loops:
                try:
                    busy = step() or busy
                except Exception:  # noqa: BLE001 - a step's fault must not end the thread every engine and trainer shares
                    failures = self._failures[step] = self._failures.get(step, 0) + 1
                    if failures & (failures - 1) == 0:  # the 1st, 2nd, 4th, 8th... in a row: not 20 lines a second
                        log.exception("compute.loop_failed", step=getattr(step, "__qualname__", repr(step)), failures=failures)
                else:
                    self._failures.pop(step, None)
            if self._failures:  # a removed step's count goes with it (it holds its engine)
                self._failures = {step: n for step, n in self._failures.items() if step in loops}
            if not busy:
                self._wake.wait(0.05)


_COMPUTE = ComputeThread()


def compute_thread() -> ComputeThread:
    """The process's compute thread (started on first use)."""
    return _COMPUTE
