"""Spawn a wrapped argv, capture bounded output, and kill the whole tree at the deadline."""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

from .base import SandboxSetupError

_CHUNK = 65536
# After the main process exits, how long to wait for pipes held by stragglers to close.
_DRAIN_GRACE_S = 0.5


@dataclass
class Outcome:
    returncode: int
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    duration_s: float


class _Capture:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
        if room > 0:
            self.data += chunk[:room]
        # Past the limit we keep reading and drop: stopping would block or SIGPIPE the child.


def execute(
    argv: list[str],
    *,
    env: Mapping[str, str],
    wall_time_s: float,
    max_output_bytes: int,
    spawn_context: AbstractContextManager[None],
    kill_tree: Callable[[], None],
    stdin: int = subprocess.DEVNULL,
) -> Outcome:
    """Run argv to completion or deadline. ``kill_tree`` must leave no process behind."""
    start = time.monotonic()
    deadline = start + wall_time_s
    try:
        with spawn_context:
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
                start_new_session=True,  # its own process group, killed as one
                close_fds=True,
            )
    except OSError as exc:
        raise SandboxSetupError(f"cannot start {argv[0]}: {exc}") from exc

    captures = {proc.stdout: _Capture(max_output_bytes), proc.stderr: _Capture(max_output_bytes)}
    timed_out = False
    sel = selectors.DefaultSelector()
    try:
        for stream in captures:
            sel.register(stream, selectors.EVENT_READ)
        exited_at: float | None = None
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = proc.poll() is None
                break
            if proc.poll() is not None:
                exited_at = exited_at or now
                if not sel.get_map() or now - exited_at > _DRAIN_GRACE_S:
                    break
            if not sel.get_map():  # the child closed both pipes but may still run
                try:
                    proc.wait(timeout=min(deadline - now, 0.1))
                except subprocess.TimeoutExpired:
                    pass
                continue
            for key, _ in sel.select(timeout=min(deadline - now, 0.1)):
                chunk = os.read(key.fd, _CHUNK)  # readable, so this does not block
                if chunk:
                    captures[key.fileobj].feed(chunk)  # type: ignore[index]
                else:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()
        _kill_group(proc)
        kill_tree()
        proc.wait()
        for stream in captures:
            assert stream is not None
            stream.close()

    out, err = captures[proc.stdout], captures[proc.stderr]
    return Outcome(
        returncode=proc.returncode,
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        truncated=out.truncated or err.truncated,
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Killing the outer process fires the parent-death signals down the chain, and the
    # death of a PID namespace's init kills every process inside it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
