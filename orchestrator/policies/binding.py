"""Parsing and checking policy bindings: ``model``, ``replay:FILE``, ``python:pkg.mod:fn``,
``builtin:NAME`` and ``openai:MODEL@BASE_URL``."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..registry import Registry

KINDS = ("model", "replay", "python", "builtin", "openai")


@dataclass(frozen=True)
class Binding:
    kind: str
    target: str = ""
    # a ``python`` binding made from a callable itself (the Python API), not from its import path
    fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.kind if self.kind == "model" else f"{self.kind}:{self.target}"

    def check(self, registry: Registry) -> None:
        """Raise ValueError when the binding cannot work (a missing file, module, plugin)."""
        if self.kind == "replay" and not Path(self.target).is_file():
            raise ValueError(f"replay file not found: {self.target}")
        if self.kind == "python" and self.fn is None:
            load_callable(self.target)
        if self.kind == "openai":
            from .openai import parse_target

            parse_target(self.target)
        if self.kind == "builtin" and self.target not in registry.items["policies"]:
            known = ", ".join(registry.names("policies")) or "none"
            raise ValueError(f"unknown builtin policy {self.target!r} (known: {known})")


def parse_binding(text: str, base_dir: Path | None = None) -> Binding:
    kind, sep, target = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown policy kind {kind!r} in {text!r}: use one of {', '.join(KINDS)}")
    if kind == "model":
        if sep:  # model:NAME had bound the run's model, NAME ignored
            raise ValueError(f"policy {text!r}: 'model' takes nothing after it (the model is --model's)")
        return Binding("model")
    if not target:
        raise ValueError(f"policy {text!r} needs a target after '{kind}:'")
    if kind == "replay" and base_dir is not None:
        target = str((base_dir / target).resolve())
    return Binding(kind, target)


def load_callable(target: str) -> Callable[..., Any]:
    """``pkg.mod:fn`` (or ``pkg.mod.fn``) to the callable it names."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"python policy {target!r} must look like pkg.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way on import
        raise ValueError(f"cannot import {module_name!r} for python policy: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{module_name!r} has no callable {attr!r}")
    return fn
