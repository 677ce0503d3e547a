"""What the recipe benchmarks share (not a benchmark itself: the leading underscore keeps it out
of tests/test_benchmarks.py): run a recipe's episodes on a fresh engine over a loaded model."""
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from orchestrator.engines.hf import EngineStats, HFEngine
from orchestrator.models import LoadedModel
from orchestrator.rollout import RunOptions, RunResult, build_policies, run_team
from orchestrator.team import Team


async def _run(team: Team, loaded: LoadedModel, episodes: int, out: Path, concurrency: int | None,
               engine_options: dict[str, Any]) -> tuple[RunResult, EngineStats]:
    engine = HFEngine(loaded, **engine_options)
    options = RunOptions(episodes=episodes, seed=0, out_dir=out, progress=False,
                         concurrency=concurrency or team.config.concurrency)
    try:
        return await run_team(team, build_policies(team, {}, lambda: engine), options), engine.stats
    finally:
        await engine.aclose()


def run_recipe(team: Team, loaded: LoadedModel, episodes: int, out: Path, concurrency: int | None = None,
               **engine_options: Any) -> tuple[RunResult, EngineStats]:
    """One run of ``episodes`` episodes (seed 0) on ``HFEngine(loaded, **engine_options)``."""
    return asyncio.run(_run(team, loaded, episodes, out, concurrency, engine_options))


def warm_up(team: Team, loaded: LoadedModel, out: Path) -> None:
    """One untimed episode, so that first-call costs (grammar compiles, weight packing, allocator
    growth) fall on neither side of a comparison."""
    run_recipe(team, loaded, 1, out)


def parse_args(repeats: str, default_episodes: int, default_repeats: int, smoke_episodes: int) -> argparse.Namespace:
    """--model, --episodes, ``--<repeats>`` and --smoke (tiny model, one repeat, ``smoke_episodes``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=default_episodes)
    parser.add_argument(f"--{repeats}", type=int, default=default_repeats, help="the sides alternate this many times")
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.episodes = "tiny", smoke_episodes
        setattr(args, repeats, 1)
    return args
