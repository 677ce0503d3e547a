"""``rolecast train RECIPE``: train the recipe's trainable roles, each its own LoRA adapter."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import RolecastError
from .flags import add_training_flags, apply_sets, positive_int, recorded_run, rollout_workers, run_dir


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="train the recipe's trainable roles (each its own LoRA adapter)")
    p.add_argument("recipe", type=Path, help="team YAML with a `training:` block")
    p.add_argument("--steps", type=positive_int, help="training steps (default: the recipe's)")
    p.add_argument("--out", type=Path, help="run dir (default: runs/train-<recipe>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add_training_flags(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..team import load_team

    team = apply_sets(load_team(args.recipe), args.sets)
    if args.resume and not args.out:
        raise RolecastError("--resume needs --out RUN_DIR (the run to continue)")
    out = run_dir(args.out, f"train-{team.name}")
    if args.resume:
        as_started(args, team, out)
    final = train(team, args, out, resume=args.resume)
    print(json.dumps(final))
    print(f"run dir: {out}", file=sys.stderr)
    return 0


def as_started(args: argparse.Namespace, team: Any, out: Path) -> None:
    """A resumed run continues the run it checkpointed: --model, --seed and --steps default to what
    its config.yaml recorded, and a recipe, model, seed or training option that differs from it
    stops here with one line (its adapters' shapes, its schedule and its RNG belong to those)."""
    recorded = recorded_run(out)
    if recorded is None:
        return  # not a run dir: the loop says there is no checkpoint to resume
    recipe, run = recorded.get("recipe") or {}, recorded.get("run") or {}
    if recipe.get("name", team.name) != team.name:
        raise RolecastError(f"--resume: {out} is a run of recipe {recipe['name']!r}, not {team.name!r}")
    for flag, given in (("model", args.model), ("seed", args.seed)):
        if flag in run and given is not None and given != run[flag]:
            raise RolecastError(f"--resume: {out} was started with --{flag} {run[flag]}; this command gives {given}")
    args.model = args.model or run.get("model")
    args.seed = run.get("seed") if args.seed is None else args.seed
    args.steps = args.steps or run.get("steps")
    then, now = recipe.get("training") or {}, team.resolved().get("training") or {}
    # a key the run did not record is an option newer than the run: nothing to compare it with
    k = next((k for k in sorted(then) if k != "steps" and k in now and then[k] != now[k]), None)
    if k is not None:
        raise RolecastError(f"--resume: {out} was started with training.{k} = {then[k]!r}, this command has "
                            f"{now[k]!r}: resume with the --set flags it was started with")


def train(team: Any, args: argparse.Namespace, out: Path, resume: bool, extra: dict[str, Any] | None = None) -> dict:
    """Train ``team`` into ``out`` on a fresh engine and training service, as --model, --dtype,
    --engine, --device, --seed, --steps, --no-progress and --ray say; the final evaluation's row."""
    from ..engines.load import device_for, load_engine
    from ..training.client import ServiceClient
    from ..training.loop import TrainingRun, TrainOptions

    model = args.model or team.config.model
    seed = team.config.seed if args.seed is None else args.seed
    workers = rollout_workers(args, model, seed)  # first: a missing Ray fails before the model loads
    engine = load_engine(model, args.dtype, seed, args.engine, device=args.device)
    service = ServiceClient.for_engine(engine, model, seed=seed, device=device_for(args.device))
    service.attach_engine(engine)
    where = {"rollout_workers": workers.workers, "ray": args.ray} if workers else {}
    options = TrainOptions(out_dir=out, model=model, dtype=args.dtype, seed=seed, steps=args.steps, resume=resume,
                           progress=not args.no_progress, extra={"device": str(service.device), **where, **(extra or {})})

    async def go():
        try:
            return await TrainingRun(team, options, engine, service, rollouts=workers).run()
        finally:
            await engine.aclose()
            service.close()
            if workers:
                workers.close()

    return asyncio.run(go())
