"""Run untrusted commands confined: ``run(command, workdir, limits) -> SandboxResult``."""
from .base import (
    Limits,
    SandboxError,
    SandboxResult,
    SandboxSetupError,
    SandboxUnavailable,
    UnsafeBackendRefused,
)
from .pool import SandboxPool, shared_pool
from .runner import BACKENDS, ISOLATING, arun, available_backends, run, select_backend

__all__ = [
    "BACKENDS",
    "ISOLATING",
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
    "shared_pool",
]
