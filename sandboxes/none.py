"""No isolation: the command runs as the caller, with only rlimits and the memory cgroup."""
from __future__ import annotations

from .base import Backend, Layout


class NoneBackend(Backend):
    name = "none"
    isolating = False

    def available(self) -> str | None:
        return None

    def wrap(self, inner: list[str], layout: Layout) -> list[str]:
        return inner
