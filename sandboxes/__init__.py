"""Run untrusted commands confined: ``run(command, workdir, limits) -> SandboxResult``."""
from .base import (
    Limits,
    SandboxError,
    SandboxResult,
    SandboxSetupError,
    SandboxUnavailable,
    UnsafeBackendRefused,
)
from .pool import SandboxPool
from .runner import arun, available_backends, run, select_backend

__all__ = [
    "Limits",
    "SandboxError",
    "SandboxPool",
    "SandboxResult",
    "SandboxSetupError",
    "SandboxUnavailable",
    "UnsafeBackendRefused",
    "arun",
    "available_backends",
    "run",
    "select_backend",
]
