"""Shared confinement of the child: its uid, rlimits, credentials and environment.

Every isolating backend ends its argv with the same chain, run after the namespaces exist:
``sh <lifeline> prlimit <limits> -- setpriv <drop to uid> -- env -i -C <workdir> <vars> -- CMD``.
"""
from __future__ import annotations

import fcntl
import math
import os
import random
import shlex
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from .base import Limits, SandboxSetupError, SandboxUnavailable, tool

# Each run gets its own uid from this range, so RLIMIT_NPROC (counted per real uid)
# is per run, and concurrent runs cannot read each other's 0700 workdirs.
UID_BASE = 100_000
UID_SLOTS = 4096
LOCK_DIR = Path("/run/rolecast-sandbox/uids")

DEFAULT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
}


@contextmanager
def lease_uid() -> Iterator[int]:
    """Hold a uid no other run (in any process) holds, via a flock per slot."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    start = random.randrange(UID_SLOTS)
    for i in range(UID_SLOTS):
        slot = (start + i) % UID_SLOTS
        fd = os.open(LOCK_DIR / str(slot), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield UID_BASE + slot
        finally:
            os.close(fd)  # releases the lock
        return
    raise SandboxUnavailable(f"all {UID_SLOTS} sandbox uids are in use")


# The chain's tools (chown lends the workdir): a backend that lacks one is unavailable, said when
# it is chosen (a pool fails at construction), not at each run.
CHAIN_TOOLS = ("prlimit", "setpriv", "env", "chown")


def missing_tools(names: tuple[str, ...]) -> str | None:
    """``missing A, B`` for the tools of ``names`` not installed, else None."""
    missing = [name for name in names if tool(name) is None]
    return f"missing {', '.join(missing)}" if missing else None


def _require(name: str) -> str:
    path = tool(name)
    if path is None:
        raise SandboxUnavailable(f"{name} not found")
    return path


def limits_argv(limits: Limits, *, address_space: bool) -> list[str]:
    """rlimits; ``address_space`` caps virtual memory when no memory cgroup does it better."""
    mib = 1024 * 1024
    cpu = limits.cpu_time_s or math.ceil(limits.wall_time_s)
    argv = [
        _require("prlimit"),
        f"--cpu={cpu}",
        f"--fsize={limits.max_file_size_mb * mib}",
        f"--nproc={limits.max_processes}",
        "--core=0",
    ]
    if address_space:
        argv.append(f"--as={limits.memory_mb * mib}")
    return argv + ["--"]


def drop_privileges_argv(uid: int) -> list[str]:
    # setuid away from 0 clears permitted/effective/ambient caps; we also empty the
    # bounding and inheritable sets and set no_new_privs so setuid binaries gain nothing.
    # pdeathsig is re-armed because the kernel clears it on the uid change.
    return [
        _require("setpriv"),
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--no-new-privs",
        "--pdeathsig=KILL",
        "--",
    ]


@contextmanager
def lifeline() -> Iterator[int]:
    """The read end of a pipe, for the chain's stdin: its write end, held by this process alone
    and never written, stays open until the block is left, and closes if this process dies."""
    read_end, write_end = os.pipe()
    try:
        yield read_end
    finally:
        os.close(read_end)
        os.close(write_end)


def lifeline_argv(uid: int) -> list[str]:
    """The chain's first link: a watcher that kills the run once the spawning Python has died,
    however early that was.

    The chain's stdin is a :func:`lifeline`; the watcher's read of it ends at EOF, when the
    spawner exits or is killed. Parent-death signals alone left orphans: bwrap arms its own and
    its namespace init's only after forking, so a spawner SIGKILLed as bwrap started left both
    running with the command for its whole wall time (6 runs in 20 here; the CI saw it too).
    The watcher runs as root, so the command can neither signal it nor count it against
    max_processes; it kills the chain's own pid (every link execs the next) and then, as
    ``uid``, all of that uid's processes, so it reaches nothing else. It forks twice, so the
    command never finds it among its own children; the command's stdin is /dev/null as before.
    """
    kill_all = shlex.join([_require("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                           "/bin/sh", "-c", "kill -s KILL -- -1"])
    script = "\n".join([
        "exec 3<&0 </dev/null",
        # $$ first: a spawner dead before setpriv ran left the chain root, out of the uid's kill
        f"( {{ read -r line <&3; kill -s KILL $$; exec {kill_all}; }} >/dev/null 2>&1 & )",
        'exec "$@" 3<&-',
    ])
    return ["/bin/sh", "-c", script, "rolecast-lifeline"]


def environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    return {**DEFAULT_ENV, **(extra or {})}


def env_argv(workdir: Path, env: Mapping[str, str]) -> list[str]:
    # env runs as the final uid, so it can enter a 0700 workdir the helpers cannot.
    return [_require("env"), "-i", "-C", str(workdir), "--", *(f"{k}={v}" for k, v in env.items())]


def chown_tree(root: Path, uid: int, gid: int, *, only_from: int | None = None) -> None:
    """lchown everything under root (never following links the child may have planted).

    ``only_from`` restricts the change to entries owned by that uid: on the way back we
    touch only what the sandbox owns. GNU chown walks any depth and path length: os.walk
    recursed, and lstat failed past PATH_MAX, so a child that nested deep enough crashed
    the hand-back with the workdir still lent.
    """
    argv = [_require("chown"), "-R", "-P", "-h", *([f"--from={only_from}"] if only_from is not None else [])]
    done = subprocess.run([*argv, f"{uid}:{gid}", "--", str(root)], capture_output=True, text=True, env=DEFAULT_ENV)
    if done.returncode:
        raise SandboxSetupError(f"cannot chown {root}: {done.stderr.strip()}")


def check_reachable(workdir: Path, from_host: Callable[[Path], bool]) -> str | None:
    """Why an unprivileged uid could not reach workdir through host directories, if so."""
    for parent in workdir.parents:
        if not from_host(parent):
            continue  # made 0755 in the sandbox's own root or tmpfs
        if not os.stat(parent).st_mode & 0o001:
            return f"{parent} is not searchable by other users (chmod o+x, or use a workdir under /tmp)"
    return None
