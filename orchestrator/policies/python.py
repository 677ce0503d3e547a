"""A Python callable as a policy: ``fn(request) -> str | PolicyOutput``, sync or async."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .base import PolicyOutput, PolicyRequest


class PythonPolicy:
    def __init__(self, fn: Callable[[PolicyRequest], Any]):
        self.fn = fn

    async def __call__(self, request: PolicyRequest) -> PolicyOutput | str:
        result = self.fn(request)
        if inspect.isawaitable(result):
            result = await result
        return result
