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
# The host folders a sandbox sees (read-only): the OS's programs, libraries and /etc. The rest of
# the host (/work, /srv, /home, /var...) is absent, since user data lives there: a recipe, its
# tasks file and a run's config.yaml hold the hidden tests a function under test could read.
# /nix is NixOS's /usr (its store is public by design); those missing here are skipped.
SYSTEM = tuple(Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/nix"))


@dataclass(frozen=True)
class Layout:
    """What the child sees of the host filesystem, rendered by each isolating backend.

    A new read-only root holding the ``system`` folders (symlinks stay symlinks), a private
    /proc, /dev and /dev/shm, and a private tmpfs /tmp of ``tmp_size_bytes``; ``hidden`` folders
    (inside those, or inside ``readable`` ones) are replaced by empty root-owned tmpfs; ``readable``
    paths are bound read-only at their own paths and ``workdir`` writable. Folders on the way to
    those are made 0755 in the new root (or in the tmpfs that holds them).
    """

    workdir: Path
    system: tuple[Path, ...]
    hidden: tuple[Path, ...]
    readable: tuple[Path, ...]
    tmp_size_bytes: int

    def from_host(self, path: Path) -> bool:
        """Whether ``path`` inside is the host's own (under a system folder, not in a tmpfs over it)."""
        return any(path.is_relative_to(s) for s in self.system) and not any(
            path.is_relative_to(t) for t in (TMP, *self.hidden))

    def mounts(self) -> list[tuple[Path, str]]:
        """The ``hidden`` tmpfs and the ``readable`` and workdir binds, as ``(path, "hide" | "read"
        | "write")``, parents first: Python inside a hidden folder, or a folder hidden inside a
        bound one, is mounted over it."""
        marks = [*((p, "hide") for p in self.hidden), *((p, "read") for p in self.readable), (self.workdir, "write")]
        return sorted(marks, key=lambda mark: len(mark[0].parts))

    def dirs_to_create(self, dest: Path) -> list[Path]:
        """Ancestors of ``dest`` missing inside, top first: those in the new root or in a tmpfs."""
        tops = {TMP, *self.system, *self.hidden}
        return [p for p in reversed(dest.parents) if p != p.parent and p not in tops and not self.from_host(p)]


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
