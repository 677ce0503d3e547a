"""A per-run cgroup-v1 memory group: memory limit, OOM detection, and the whole-tree kill.

Created under this process's own memory cgroup, so the runs stay inside whatever
limit the host already puts on us. The child joins it without any extra exec: the
spawning thread moves itself in (cgroup v1 ``tasks`` takes thread ids), forks, and
moves back; the child inherits the group at fork.
"""
from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import structlog

log = structlog.get_logger()

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


@cache
def _own_group() -> Path | None:
    """This process's memory cgroup directory, or None when v1 memory is not mounted/writable."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, rel = line.split(":", 2)
            if "memory" in controllers.split(","):
                group = MEMORY_ROOT / rel.lstrip("/")
                base = group / "rolecast-sandbox"
                base.mkdir(exist_ok=True)
                return group
    except OSError as exc:
        log.info("sandbox.cgroup_unavailable", reason=str(exc))
    return None


def available() -> bool:
    return _own_group() is not None


class MemoryGroup:
    def __init__(self, path: Path, parent: Path) -> None:
        self.path = path
        self._parent = parent

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> MemoryGroup | None:
        parent = _own_group()
        if parent is None:
            return None
        path = parent / "rolecast-sandbox" / name
        if path.exists():  # left by a crashed run: its counters would be stale
            cls(path, parent).destroy()
        for n in itertools.count(1):  # one that would not empty or go (destroy warned): a name of our own
            try:
                path.mkdir()
                break
            except FileExistsError:
                path = path.with_name(f"{name}.{n}")
        group = cls(path, parent)
        group._write("memory.limit_in_bytes", limit_bytes)
        if (path / "memory.memsw.limit_in_bytes").exists():
            group._write("memory.memsw.limit_in_bytes", limit_bytes)  # no escape into swap
        return group

    def _write(self, name: str, value: int) -> None:
        (self.path / name).write_text(str(value))

    @contextmanager
    def joined(self) -> Iterator[None]:
        """Children forked by the current thread inside this block start in the group."""
        try:
            (self.path / "tasks").write_text(str(threading.get_native_id()))
            yield
        finally:
            self._leave()

    def _leave(self) -> None:
        """Move the calling thread back to the parent group; harmless where it already is."""
        (self._parent / "tasks").write_text(str(threading.get_native_id()))

    def oom_killed(self) -> bool:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value) > 0
        return int((self.path / "memory.failcnt").read_text()) > 0  # kernels before 4.13

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty; False if it would not empty."""
        # A signal (Ctrl-C, SIGTERM) can interrupt `joined` before the spawning thread moved
        # back, and then this process is listed too: it leaves first, and never kills itself.
        self._leave()
        own = str(os.getpid())
        deadline = time.monotonic() + timeout_s
        while True:
            pids = (self.path / "cgroup.procs").read_text().split()
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                if pid == own:
                    continue
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def destroy(self) -> None:
        if not self.kill_all():
            log.warning("sandbox.cgroup_not_empty", path=str(self.path))
            return
        for _ in range(100):  # rmdir can race the last exit being accounted
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)
        log.warning("sandbox.cgroup_leaked", path=str(self.path))
