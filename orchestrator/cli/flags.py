"""Flags several commands share, and what they turn into: role bindings, adapter dirs, run dirs."""
from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from ..engines.load import BACKENDS
from ..errors import RolecastError
from ..policies.binding import Binding, parse_binding
from ..registry import default_registry

MODEL_HELP = "smollm2-135m (default), tiny, a local Hugging Face model dir, or a hub id (org/name)"
ENGINE_HELP = "generation backend: hf (default) or vllm (GPU only; pip install 'rolecast[vllm]')"
DEVICE_HELP = "auto (default: a CUDA GPU where there is one, else the CPU), cpu, cuda or cuda:N"
ADAPTER_HELP = "load a PEFT-format adapter dir (a run's sampler/NAME, say) as adapter NAME (repeatable)"
POLICY_HELP = "bind a role: replay:FILE, python:pkg.mod:fn, builtin:NAME, openai:MODEL@URL or model (repeatable)"


def add_model_flags(p: argparse.ArgumentParser, *, model_default: str | None = None,
                    adapter_help: str | None = ADAPTER_HELP, dtype_help: str | None = None) -> None:
    """--model, --dtype, --engine, --device, and --adapter unless ``adapter_help`` is None."""
    p.add_argument("--model", default=model_default, help=MODEL_HELP)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help=dtype_help)
    p.add_argument("--engine", default="hf", choices=BACKENDS, help=ENGINE_HELP)
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    if adapter_help is not None:
        p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH", help=adapter_help)


def add_episode_flags(p: argparse.ArgumentParser, json_help: str) -> None:
    """--seed, --concurrency, --json and --no-progress: how a command plays its episodes."""
    p.add_argument("--seed", type=int, help="run seed (default: the team's `seed`)")
    p.add_argument("--concurrency", type=int, help="episodes in flight at once")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def add_policy_flag(p: argparse.ArgumentParser, help: str = POLICY_HELP) -> None:
    p.add_argument("--policy", action="append", default=[], metavar="ROLE=BINDING", help=help)


def parse_policy_flags(flags: list[str]) -> dict[str, Binding]:
    out: dict[str, Binding] = {}
    registry = default_registry()
    for flag in flags:
        role, sep, value = flag.partition("=")
        if not sep or not role or not value:
            raise RolecastError(f"--policy {flag!r}: expected ROLE=BINDING, e.g. judge=replay:judge.jsonl")
        try:
            binding = parse_binding(value, base_dir=Path.cwd())
            binding.check(registry)
        except ValueError as exc:
            raise RolecastError(f"--policy {flag!r}: {exc}") from None
        out[role] = binding
    return out


def parse_adapter_flags(flags: list[str]) -> dict[str, Path]:
    adapters = {}
    for flag in flags:
        name, sep, path = flag.partition("=")
        if not sep or not name or not Path(path, "adapter_config.json").is_file():
            raise RolecastError(f"--adapter {flag!r}: expected NAME=PATH to a PEFT adapter dir (with adapter_config.json)")
        adapters[name] = Path(path)
    return adapters


def run_dir(out: Path | None, stem: str) -> Path:
    """``--out``, or ``runs/<stem>-<time>``."""
    return out or Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def play(team: Any, policies: dict[str, Any], options: Any) -> Any:
    """``run_team`` to the end, then close each engine the policies use, once."""
    from ..rollout import run_team

    async def go():
        try:
            return await run_team(team, policies, options)
        finally:
            for engine in {id(p.engine): p.engine for p in policies.values() if hasattr(p, "engine")}.values():
                await engine.aclose()

    return asyncio.run(go())
