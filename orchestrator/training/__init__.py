"""Local multi-adapter LoRA training, shaped like the Tinker API (forward_backward, optim_step, ...).

The client pulls in torch and transformers; it is imported on first use so that plugins and
the CLI can import the light modules (datums, trainer) without that cost.
"""
from __future__ import annotations

from typing import Any

_LAZY = {
    "ServiceClient": "client", "TrainingClient": "client", "APIFuture": "client",
    "AdamParams": "types", "Datum": "types", "ForwardBackwardOutput": "types", "LoraConfig": "types", "ModelInput": "types",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)
