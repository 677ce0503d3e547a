"""The sandbox interface: limits in, result out, and the errors a caller can catch."""
from __future__ import annotations

import math
import shutil
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Helpers are resolved once, to absolute paths: the sandbox PATH is not the host's,
# and looking each up per run would cost time on every start.
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def tool(name: str) -> str | None:
    return shutil.which(name, path=_SEARCH_PATH)


class SandboxError(Exception):
    """Base class: the sandbox itself failed (never raised for what the command did)."""


class SandboxUnavailable(SandboxError):
    """The requested backend cannot run here (binary missing, not root, ...)."""


class UnsafeBackendRefused(SandboxError):
    """Backend ``none`` was asked for without ``allow_unsafe=True``."""


class SandboxSetupError(SandboxError):
    """The run could not be prepared or started (bad workdir, spawn failure, ...)."""


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits. Sizes are MiB; ``None`` for cpu means ``ceil(wall_time_s)``."""

    wall_time_s: float = 60.0
    cpu_time_s: int | None = None
    memory_mb: int = 1024
    max_processes: int = 64  # tasks (threads count) of the run's own uid
    max_file_size_mb: int = 64
    max_output_bytes: int = 1_000_000  # per stream; the rest is read and dropped
    tmp_size_mb: int = 64  # the private /tmp (a tmpfs, also charged to memory)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            # finite too: the CPU rlimit is ceil(wall_time_s), which inf crashed and nan let through
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"Limits.{name} must be positive and finite, got {value!r}")
            # a fractional size reached the cgroup (OSError), bwrap's --size (exit 1) or a slice (TypeError)
            if name != "wall_time_s" and value is not None and not isinstance(value, int):
                raise ValueError(f"Limits.{name} must be an int, got {value!r}")


@dataclass
class SandboxResult:
    exit_code: int | None  # shell convention: 128+N when killed by signal N
    signal: int | None
    timed_out: bool
    out_of_memory: bool
    stdout: str
    stderr: str
    truncated: bool  # stdout or stderr was cut at Limits.max_output_bytes
    duration_s: float
    backend: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TMP = Path("/tmp")


@dataclass(frozen=True)
class Layout:
    """What the child sees of the host filesystem, rendered by each isolating backend.

    ``/`` is read-only; /tmp is a private tmpfs of ``tmp_size_bytes``; ``hidden`` dirs
    are replaced by empty root-owned tmpfs (/root holds secrets, and is 0700 anyway);
    ``readable`` paths are re-exposed read-only inside them; ``workdir`` is bound
    writable at its own path.
    """

    workdir: Path
    hidden: tuple[Path, ...]
    readable: tuple[Path, ...]
    tmp_size_bytes: int

    @property
    def tmpfs_tops(self) -> tuple[Path, ...]:
        return (TMP, *self.hidden)

    def dirs_to_create(self, dest: Path) -> list[Path]:
        """Ancestors of ``dest`` inside one of our tmpfs mounts (those start empty)."""
        for top in self.tmpfs_tops:
            if dest != top and dest.is_relative_to(top):
                return [p for p in reversed(dest.parents) if p != top and p.is_relative_to(top)]
        return []


class Backend(ABC):
    name: str
    isolating: bool = True  # False: runs as the caller, with limits only
    # The backend's init reports a child killed by signal N as exit status 128+N.
    signal_as_exit_code: bool = False

    @abstractmethod
    def available(self) -> str | None:
        """None when usable here, else the reason it is not."""

    @abstractmethod
    def wrap(self, inner: list[str], layout: Layout) -> list[str]:
        """Argv that sets up isolation for ``layout`` then execs ``inner``."""
