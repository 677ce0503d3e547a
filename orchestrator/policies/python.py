"""A Python callable as a policy: ``fn(request) -> str | PolicyOutput`` (sync or async)."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from ..errors import PolicyError
from .base import PolicyOutput, PolicyRequest


class PythonPolicy:
    def __init__(self, fn: Callable[[PolicyRequest], Any]):
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)

    async def __call__(self, request: PolicyRequest) -> PolicyOutput:
        result = await self.fn(request) if self.is_async else self.fn(request)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, PolicyOutput):
            return result
        if isinstance(result, str):
            return PolicyOutput(text=result)
        raise PolicyError(f"python policy {getattr(self.fn, '__name__', self.fn)!r} returned {type(result).__name__}, not str")
