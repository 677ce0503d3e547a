"""No isolation: the command runs as the caller, with only rlimits and the memory cgroup."""
from __future__ import annotations

from .base import Backend, Layout
from .confine import missing_tools


class NoneBackend(Backend):
    name = "none"
    isolating = False

    def available(self) -> str | None:
        return missing_tools(("prlimit", "env"))  # the limits, and the cleared environment

    def wrap(self, inner: list[str], layout: Layout) -> list[str]:
        return inner
