"""``run``/``arun``: pick a backend, confine the command, and report what happened."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future
from contextlib import nullcontext
from pathlib import Path
from typing import TypeVar

import structlog

from . import cgroup
from .base import (
    SYSTEM,
    TMP,
    Backend,
    Layout,
    Limits,
    SandboxResult,
    SandboxSetupError,
    SandboxUnavailable,
    UnsafeBackendRefused,
)
from .bwrap import BwrapBackend
from .confine import (
    DEFAULT_ENV,
    check_reachable,
    chown_tree,
    drop_privileges_argv,
    env_argv,
    environment,
    lease_uid,
    lifeline,
    lifeline_argv,
    limits_argv,
)
from .none import NoneBackend
from .process import Outcome, execute
from .unshare import UnshareBackend

log = structlog.get_logger()
T = TypeVar("T")

BACKENDS: dict[str, Backend] = {b.name: b for b in (BwrapBackend(), UnshareBackend(), NoneBackend())}
ISOLATING = tuple(name for name, b in BACKENDS.items() if b.isolating)  # what untrusted code may run in
AUTO_ORDER = ("bwrap", "unshare")  # best first; "none" is never chosen automatically
# Never lent as (or inside) a workdir: their owners' files; /run holds daemons' Unix sockets
PRIVATE = (Path("/root"), Path("/home"), Path("/run"))

Command = str | Sequence[str]


def available_backends() -> list[str]:
    return [name for name, b in BACKENDS.items() if b.isolating and b.available() is None]


@functools.cache
def _auto() -> Backend:
    reasons = {}
    for name in AUTO_ORDER:
        reason = BACKENDS[name].available()
        if reason is None:
            log.info("sandbox.backend_selected", backend=name)
            return BACKENDS[name]
        reasons[name] = reason
    raise SandboxUnavailable(f"no isolating backend: {reasons}")


def select_backend(name: str = "auto", *, allow_unsafe: bool = False) -> Backend:
    if name == "auto":
        return _auto()
    if name not in BACKENDS:
        raise SandboxUnavailable(f"unknown backend {name!r}; choose from auto, {', '.join(BACKENDS)}")
    if name == "none" and not allow_unsafe:
        raise UnsafeBackendRefused("backend 'none' does not isolate; pass allow_unsafe=True (CLI: --unsafe)")
    backend = BACKENDS[name]
    reason = backend.available()
    if reason is not None:
        raise SandboxUnavailable(f"backend {name!r} unavailable: {reason}")
    return backend


def python_paths() -> tuple[Path, ...]:
    """The interpreter running us (venv and base install), for the child to import from."""
    exe = Path(os.path.realpath(sys.executable))
    return tuple({Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix, exe.parent.parent)})


def run(
    command: Command,
    workdir: str | os.PathLike[str],
    limits: Limits | None = None,
    *,
    backend: str = "auto",
    allow_unsafe: bool = False,
    env: Mapping[str, str] | None = None,
    readable: Sequence[str | os.PathLike[str]] = (),
    hide: Sequence[str | os.PathLike[str]] = (),
) -> SandboxResult:
    """Run ``command`` (argv, or a string for ``/bin/sh -c``) confined to ``workdir``.

    Raises SandboxError subclasses for faults of the sandbox itself; whatever the
    command does (crash, timeout, OOM) comes back in the result. ``env`` adds to the
    minimal environment. The child sees the host's system folders (:data:`SYSTEM`) read-only, the
    running Python, ``readable`` paths and the workdir, and nothing else of the host; ``hide``
    names folders among those it may not see (each replaced by an empty tmpfs).
    """
    limits = limits or Limits()
    chosen = select_backend(backend, allow_unsafe=allow_unsafe)
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    if not argv:
        raise SandboxSetupError("empty command")
    try:
        wd = Path(workdir).resolve()
    except OSError as exc:  # "." in a folder since removed
        raise SandboxSetupError(f"workdir {workdir}: {exc.strerror}") from None
    if not wd.is_dir():
        raise SandboxSetupError(f"workdir {wd} is not a directory")
    # else the backend's mount fails, and that came back as the command's exit 1 (bwrap) or 32
    missing = [str(p) for p in readable if not os.path.exists(p)]
    if missing:
        raise SandboxSetupError(f"readable path {', '.join(missing)} does not exist")
    # a file (or a typo) was skipped, and stayed readable: only a folder has a tmpfs put over it
    not_folders = [str(p) for p in hide if not os.path.isdir(p)]
    if not_folders:
        raise SandboxSetupError(f"hide path {', '.join(not_folders)} is not a folder")
    system = tuple(p for p in SYSTEM if p.is_symlink() or p.is_dir())
    seen = Layout(workdir=wd, system=system, hidden=(), readable=(), tmp_size_bytes=0)
    wanted = {*python_paths(), *(Path(os.path.realpath(p)) for p in readable)}
    # only a folder the sandbox would see (the workdir's too) needs a tmpfs over it: the rest of the
    # host is absent
    hidden = tuple(p for p in map(Path, map(os.path.realpath, hide))
                   if seen.from_host(p) or any(p.is_relative_to(w) for w in (wd, *wanted)))
    seen = dataclasses.replace(seen, hidden=hidden)
    layout = dataclasses.replace(
        seen,
        # what the sandbox sees of the host already needs no bind
        readable=tuple(sorted(p for p in wanted if not seen.from_host(p))),
        tmp_size_bytes=limits.tmp_size_mb * 1024 * 1024,
    )
    tail = env_argv(wd, environment(env)) + argv
    if not chosen.isolating:
        return _execute(chosen, layout, tail, limits, f"pid-{os.getpid()}-{threading.get_native_id()}")

    # "/" (the CLI's default "." in a container) or /usr would be chowned to the sandbox's uid and
    # bound writable over the new root; /tmp would lend every other run's files, /root and /home
    # their owners' (one under /tmp is fine: the private /tmp holds only it).
    covered = [str(t) for t in (TMP, *SYSTEM, *PRIVATE) if t.is_relative_to(wd)]
    if covered:
        raise SandboxSetupError(f"workdir {wd} contains {', '.join(covered)}; use a directory of its own")
    problem = check_reachable(wd, layout.from_host)
    if problem:
        raise SandboxSetupError(f"workdir unreachable by the sandbox uid: {problem}")
    with lease_uid() as uid:
        st = wd.stat()
        try:  # a signal can land mid-lend too: what was lent goes back
            chown_tree(wd, uid, uid)
            os.chmod(wd, 0o700)  # other runs' uids see / read-only; this keeps them out
            return _execute(chosen, layout, drop_privileges_argv(uid) + tail, limits, f"uid-{uid}", lifeline_uid=uid)
        finally:
            chown_tree(wd, st.st_uid, st.st_gid, only_from=uid)
            os.chmod(wd, st.st_mode & 0o7777)


def _execute(backend: Backend, layout: Layout, tail: list[str], limits: Limits, group_name: str,
             lifeline_uid: int | None = None) -> SandboxResult:
    group = cgroup.MemoryGroup.create(group_name, limits.memory_mb * 1024 * 1024)
    try:
        chain = limits_argv(limits, address_space=group is None) + tail
        if lifeline_uid is not None:
            chain = lifeline_argv(lifeline_uid) + chain
        with lifeline() if lifeline_uid is not None else nullcontext(subprocess.DEVNULL) as stdin:
            outcome = execute(
                backend.wrap(chain, layout),
                env=DEFAULT_ENV,  # the helpers never see the caller's environment either
                wall_time_s=limits.wall_time_s,
                max_output_bytes=limits.max_output_bytes,
                spawn_context=group.joined() if group else nullcontext(),
                kill_tree=group.kill_all if group else lambda: None,
                stdin=stdin,
            )
        oom = group.oom_killed() if group else False
    finally:
        if group:
            group.destroy()
    return _result(backend, outcome, oom)


def _result(backend: Backend, outcome: Outcome, oom: bool) -> SandboxResult:
    rc = outcome.returncode
    sig: int | None = None
    if rc < 0:
        sig, rc = -rc, 128 - rc
    elif backend.signal_as_exit_code and rc > 128 and rc - 128 in _SIGNALS:
        sig = rc - 128
    return SandboxResult(
        exit_code=rc,
        signal=sig,
        timed_out=outcome.timed_out,
        out_of_memory=oom,
        stdout=outcome.stdout.decode(errors="replace"),
        stderr=outcome.stderr.decode(errors="replace"),
        truncated=outcome.truncated,
        duration_s=outcome.duration_s,
        backend=backend.name,
    )


_SIGNALS = {s.value for s in signal.Signals}


async def arun(
    command: Command,
    workdir: str | os.PathLike[str],
    limits: Limits | None = None,
    *,
    executor: Executor | None = None,
    **options: object,
) -> SandboxResult:
    """``run`` in a worker thread (the event loop keeps going); same arguments. Cancelled, it
    raises only once the run has ended (``ended_first``), or at once if it had not started."""
    call = functools.partial(run, command, workdir, limits, **options)
    return await ended_first(executor.submit(call) if executor is not None
                             else asyncio.get_running_loop().run_in_executor(None, call))  # type: ignore[arg-type]


async def ended_first(job: asyncio.Future[T] | Future[T]) -> T:
    """``job``'s result. Cancelled, CancelledError only once ``job`` has ended, within its runs'
    wall times: a sandbox's thread cannot be stopped, and a caller's clean-up that removed the
    workdir under a run still writing there left the run's later files behind. A job given as
    its executor's future, still queued, is dropped instead: a Ctrl-C with the pool full had
    waited for every queued run to start and end."""
    queued = job if isinstance(job, Future) else None
    if queued is not None:
        job = asyncio.wrap_future(queued)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        if queued is not None and queued.cancel():  # never started: nothing runs to wait for
            raise
        # A second cancel waits too: run_team cancels its lanes again as it stops (gather had
        # cancelled them already), which removed code_pair's workdirs under runs still going.
        while not job.done():
            try:
                await asyncio.wait([job])
            except asyncio.CancelledError:
                pass
        raise
