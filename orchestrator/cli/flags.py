"""Flags several commands share, and what they turn into: role bindings, adapter dirs, run dirs."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
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
DTYPE_DEFAULT = "(default auto: bfloat16 where the CPU or GPU computes it natively, else float32)"
POLICY_HELP = "bind a role: replay:FILE, python:pkg.mod:fn, builtin:NAME, openai:MODEL@URL or model (repeatable)"


def _number(text: str, convert: type, what: str) -> Any:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: a whole number above 0 (0 or less is a mistake, never a request for a default)."""
    if (value := _number(text, int, "a whole number")) < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number above 0 (seconds, say)."""
    if not (value := _number(text, float, "a number")) > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def add_model_flags(p: argparse.ArgumentParser, *, model_default: str | None = None,
                    adapter_help: str | None = ADAPTER_HELP, dtype_help: str = "the model's weights " + DTYPE_DEFAULT) -> None:
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
    p.add_argument("--concurrency", type=positive_int, help="episodes in flight at once (default: the team's `concurrency`)")
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
    """``--adapter NAME=PATH`` flags: each a PEFT adapter dir whose config reads and whose weights
    are there, each NAME once (checked here, not as a traceback when the engine loads it)."""
    adapters = {}
    for flag in flags:
        name, sep, path = flag.partition("=")
        if not sep or not name or not Path(path, "adapter_config.json").is_file():
            raise RolecastError(f"--adapter {flag!r}: expected NAME=PATH to a PEFT adapter dir (with adapter_config.json)")
        if name in adapters:
            raise RolecastError(f"--adapter {name}: given twice ({adapters[name]} and {path})")
        try:
            config = json.loads(Path(path, "adapter_config.json").read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            raise RolecastError(f"--adapter {flag!r}: cannot read its adapter_config.json: {exc}") from None
        if not isinstance(config, dict):
            raise RolecastError(f"--adapter {flag!r}: its adapter_config.json is not a JSON object")
        if not any(Path(path, f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
            raise RolecastError(f"--adapter {flag!r}: no adapter_model.safetensors (or .bin) beside its config")
        adapters[name] = Path(path)
    return adapters


def check_adapter_names(adapters: dict[str, Path], team: Any) -> None:
    """Every ``--adapter`` NAME is one a role of ``team`` plays: a misspelt one would leave that
    role on the base model while the table names the adapter."""
    played = sorted({spec.config.policy.adapter for spec in team.roles.values()} - {None})
    for name in adapters:
        if name not in played:
            raise RolecastError(f"--adapter {name}: no role of {team.name} plays adapter {name!r} "
                                f"(its roles' adapters: {', '.join(played) or 'none'})")


def run_dir(out: Path | None, stem: str, fresh: bool = False) -> Path:
    """``--out``, or ``runs/<stem>-<time>``; a path through an existing file is one line here, not a
    traceback when the run first writes. ``fresh``: an --out that already holds a run (its
    config.yaml) is refused too, rather than overwritten."""
    if out is not None:
        blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise RolecastError(f"--out {out}: {blocker} is a file, not a folder")
        if fresh and (out / "config.yaml").exists():
            raise RolecastError(f"--out {out} already holds a run: give another --out, or remove it first")
    return out or Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def recorded_run(out: Path) -> dict[str, Any] | None:
    """What ``out/config.yaml`` records of the run there (its ``recipe`` and ``run`` mappings);
    None where there is none, and a damaged one is one line, not a traceback."""
    import yaml

    path = out / "config.yaml"
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RolecastError(f"{path} is unreadable ({type(exc).__name__}): is {out} a rolecast run?") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k) or {}, dict) for k in ("recipe", "run")):
        raise RolecastError(f"{path} is not a run's config (a mapping of recipe and run): is {out} a rolecast run?")
    return data


def policies_and_workers(args: argparse.Namespace, team: Any, overrides: dict[str, Binding], model: str, seed: int,
                         adapters: dict[str, Path], extra_adapters: dict[str, Path] | None = None) -> tuple[dict, Any]:
    """The policies that play ``team`` here, loading the engine with ``adapters`` when a role needs
    it; or, with --ray, Ray rollout workers holding the adapters (the policies then only check
    the bindings)."""
    from ..engines.load import load_engine
    from ..rollout import build_policies

    check_adapter_names(adapters, team)
    adapters = {**adapters, **(extra_adapters or {})}
    workers = rollout_workers(args, model, seed)
    if workers is None:
        return build_policies(team, overrides, lambda: load_engine(model, args.dtype, seed, args.engine, adapters,
                                                                   args.device)), None
    for name, path in adapters.items():
        workers.publish(name, path, 1)
    return build_policies(team, overrides, lambda: None), workers


def exit_code(result: Any) -> int:
    """1, with the first error on stderr, when every episode of ``result`` failed or timed out (its
    table of zeros would read as a result); else 0."""
    from ..rollout import every_episode_failed

    if first := every_episode_failed(result.episodes):
        print(f"rolecast: every episode failed; the first: {first.error}", file=sys.stderr)
        return 1
    return 0


def play(team: Any, policies: dict[str, Any], options: Any, workers: Any = None,
         overrides: dict[str, Binding] | None = None) -> Any:
    """``run_team`` to the end (on ``workers``, when given, with ``options.concurrency`` episodes in
    flight on each), then close each engine the policies use, once, and the workers."""
    import dataclasses

    from ..rollout import run_team

    if workers is not None:
        options = dataclasses.replace(options, play=workers.bind(team, overrides or {}),
                                      concurrency=options.concurrency * workers.workers)

    async def go():
        try:
            return await run_team(team, policies, options)
        finally:
            engines = {id(p.engine): p.engine for p in policies.values() if getattr(p, "engine", None) is not None}
            for engine in engines.values():
                await engine.aclose()
            if workers is not None:
                workers.close()

    return asyncio.run(go())


def add_training_flags(p: argparse.ArgumentParser) -> None:
    """--model, --dtype, --engine, --device, --set, --seed, --no-progress and the Ray flags: how a
    command trains."""
    add_model_flags(p, adapter_help=None, dtype_help="the engine's weights when sampling " + DTYPE_DEFAULT)
    add_set_flag(p)
    p.add_argument("--seed", type=int, help="run seed (default: the recipe's `seed`)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_ray_flags(p)


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="play episodes on Ray rollout workers: `local` (default) starts Ray here; "
                        "an address (auto, ray://host:10001) joins a cluster (pip install 'rolecast[ray]')")
    p.add_argument("--rollout-workers", type=positive_int, default=2, metavar="N",
                   help="--ray: rollout workers, each with its own engine (default 2)")


def rollout_workers(args: argparse.Namespace, model: str, seed: int) -> Any:
    """The Ray rollout workers ``--ray`` asks for, or None. Workers take the command's --device;
    on CUDA each gets a GPU of its own."""
    if args.ray is None:
        return None
    from ..workers import RayOptions, RayRollouts

    cuda = str(args.device).startswith("cuda")
    options = RayOptions(address=args.ray, workers=args.rollout_workers, gpus_per_worker=1.0 if cuda else 0.0)
    return RayRollouts(options, model=model, dtype=args.dtype, seed=seed, backend=args.engine,
                       device=args.device if cuda else "cpu")


def add_set_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="change a training option for this run: group_size=4, eval_episodes=8, adam.learning_rate=1e-4, "
                        "trainer_config.members=8 ... (repeatable)")


def apply_sets(team: Any, sets: list[str]) -> Any:
    """``team`` with ``--set KEY=VALUE`` training options applied (each VALUE read as YAML) and
    checked as the recipe's own are (``team.with_training_options``)."""
    import yaml

    from ..team import with_training_options

    options: dict[str, Any] = {}
    for flag in sets:
        key, sep, raw = flag.partition("=")
        if not sep or not key:
            raise RolecastError(f"--set {flag!r}: expected KEY=VALUE, e.g. group_size=4 or adam.learning_rate=1e-4")
        try:
            options[key] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise RolecastError(f"--set {flag!r}: VALUE is not YAML ({type(exc).__name__})") from None
    return with_training_options(team, options)
