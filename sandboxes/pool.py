"""Bounded concurrency for sandboxes, and per-episode private copies of a task's repo."""
from __future__ import annotations

import asyncio
import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from .base import Limits, SandboxResult, SandboxSetupError, tool
from .runner import Command, arun, ended_first, select_backend

T = TypeVar("T")


def copy_private(src: str | os.PathLike[str], dest: str | os.PathLike[str], ignore: Callable | None = None) -> Path:
    """A real copy of the folder ``src`` at ``dest`` (which must not exist): hardlinks would let one
    episode's in-place writes show up in another's files. ``ignore`` as for ``shutil.copytree``.
    The copy is 0700, as a run makes it while lent: other runs' uids never enter it between runs."""
    src = Path(src)
    if not src.is_dir():
        raise SandboxSetupError(f"repo {src} is not a directory")
    copy = Path(shutil.copytree(src, dest, symlinks=True, ignore=ignore))
    copy.chmod(0o700)
    return copy


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` and everything under it, however deep. rm, not shutil.rmtree: that recurses
    (Python 3.11), so a command nesting ~1000 dirs raised RecursionError and left the tree behind."""
    subprocess.run([str(tool("rm")), "-rf", "--", str(path)])


SCRATCH_PREFIX = "rolecast-scratch-"
_scratch: dict[tuple[int, str], Path] = {}


def scratch_root() -> Path:
    """This process's folder for temporary work (``$TMPDIR/rolecast-scratch-<pid namespace>-<pid>``,
    0711), removed at exit. A process killed before it could clean up (SIGKILL, the OOM killer, a
    Ray worker killed) left its workdirs and repo copies in $TMPDIR for good: the next process to
    make its own removes those of the processes of its pid namespace that are gone."""
    pid, parent = os.getpid(), tempfile.gettempdir()
    path = _scratch.get((pid, parent))
    if path is None or not path.is_dir():  # first use here, or removed under us
        namespace = os.stat("/proc/self/ns/pid").st_ino  # a pid means nothing in another container
        for folder in Path(parent).glob(f"{SCRATCH_PREFIX}{namespace}-*"):
            owner = folder.name.rsplit("-", 1)[1]
            if owner.isdigit() and not _alive(int(owner)):
                remove_tree(folder)
        if path is None:
            path = _scratch[pid, parent] = Path(parent) / f"{SCRATCH_PREFIX}{namespace}-{pid}"
            atexit.register(_remove_own, path, pid)
        path.mkdir(exist_ok=True)
        path.chmod(0o711)
    return path


def _remove_own(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # a forked child inherits the handler, not the folder
        remove_tree(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def new_temporary_dir(prefix: str, dir: str | os.PathLike[str] | None = None) -> Path:
    """``tempfile.mkdtemp`` in ``dir`` (default: :func:`scratch_root`), but searchable by others
    (0711, not listable): a sandbox's uid must pass through it to a workdir inside. mkdtemp's 0700
    failed every run outside /tmp (TMPDIR=/var/tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=dir or scratch_root()))
    path.chmod(0o711)
    return path


@contextmanager
def temporary_dir(prefix: str) -> Iterator[Path]:
    """A new temporary folder for sandboxed runs (:func:`new_temporary_dir`), removed with
    :func:`remove_tree` on exit."""
    path = new_temporary_dir(prefix)
    try:
        yield path
    finally:
        remove_tree(path)


class SandboxPool:
    """At most ``max_concurrent`` sandboxes at once, each in its own worker thread. The thread pool
    is the only bound: it holds no asyncio object, so one pool serves successive event loops (a
    ``rolecast compare`` trains each strategy under its own ``asyncio.run``)."""

    def __init__(
        self,
        max_concurrent: int | None = None,
        *,
        backend: str = "auto",
        limits: Limits | None = None,
        allow_unsafe: bool = False,
        scratch_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.max_concurrent = max_concurrent or os.cpu_count() or 1
        self.backend = select_backend(backend, allow_unsafe=allow_unsafe).name  # fail early
        self.limits = limits or Limits()
        self.allow_unsafe = allow_unsafe
        self.scratch_dir = Path(scratch_dir) if scratch_dir else None  # None: scratch_root()
        self._executor = ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="sandbox")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a blocking function that runs sandboxes one after another, on the pool's
        threads: however many episodes call at once, at most ``max_concurrent`` run. Cancelled, it
        raises only once ``fn`` has ended, or at once if it had not started (``ended_first``)."""
        return await ended_first(self._executor.submit(fn, *args))

    async def run(
        self,
        command: Command,
        workdir: str | os.PathLike[str],
        limits: Limits | None = None,
        *,
        env: Mapping[str, str] | None = None,
        readable: Sequence[str | os.PathLike[str]] = (),
        hide: Sequence[str | os.PathLike[str]] = (),
    ) -> SandboxResult:
        """:func:`sandboxes.run` on one of the pool's threads; ``env``, ``readable`` and ``hide`` as there."""
        return await arun(
            command, workdir, limits or self.limits, executor=self._executor,
            backend=self.backend, allow_unsafe=self.allow_unsafe, env=env, readable=readable, hide=hide,
        )

    @asynccontextmanager
    async def episode(self, repo: str | os.PathLike[str]) -> AsyncIterator[Path]:
        """A private copy of ``repo`` for one episode (:func:`copy_private`), deleted on exit."""
        if self.scratch_dir:
            self.scratch_dir.mkdir(parents=True, exist_ok=True)
        dest = new_temporary_dir("episode-", self.scratch_dir)
        try:
            # cancelled mid-copy, the removal below raced the copy's thread and left the copy behind
            await ended_first(asyncio.get_running_loop().run_in_executor(None, copy_private, repo, dest / "repo"))
            yield dest / "repo"
        finally:
            await asyncio.to_thread(remove_tree, dest)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


@functools.cache
def shared_pool(backend: str = "auto", size: int | None = None) -> SandboxPool:
    """One pool per (backend, size) for the whole process: it bounds sandboxes across the episodes
    of every environment that runs code, and keeps their long waits off asyncio's default
    executor (which policies use). ``size`` None: the CPU count."""
    return SandboxPool(size or os.cpu_count() or 1, backend=backend)
