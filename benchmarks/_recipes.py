"""What the benchmarks share (not a benchmark itself: the leading underscore keeps it out of
tests/test_benchmarks.py): run a recipe's episodes on a fresh engine over a loaded model, common
prompts, argument parsing and comparison helpers."""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from orchestrator.cli.flags import positive_int
from orchestrator.engines.hf import EngineStats, HFEngine
from orchestrator.models import LoadedModel, resolve_device
from orchestrator.rollout import RunOptions, RunResult, build_policies, run_team
from orchestrator.team import Team, load_team

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
# Story topics the generation benchmarks share (rollout, grpo_vs_trl), so both prompt alike.
TOPICS = ["a lighthouse keeper", "a chess tournament", "bread baking", "a lost dog", "the first day of school",
          "a mountain storm", "a broken robot", "a market at dawn", "an old map", "a jazz trio", "a river crossing",
          "a library at night", "a garden in winter", "a train delay", "a kite festival", "a code review"]


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
    """One run of ``episodes`` episodes (seed 0) on ``HFEngine(loaded, **engine_options)``; the
    script stops (exit 1) if one of them fails."""
    result, stats = asyncio.run(_run(team, loaded, episodes, out, concurrency, engine_options))
    # run_team only logs a failed episode: timed, it would pass for one played (and --smoke with it)
    if failed := [e for e in result.episodes if e.failed]:
        sys.exit(f"{team.name}: {len(failed)} of {episodes} episodes failed: {failed[0].error}")
    return result, stats


def warm_up(team: Team, loaded: LoadedModel, out: Path) -> None:
    """One untimed episode, so that first-call costs (grammar compiles, weight packing, allocator
    growth) fall on neither side of a comparison."""
    run_recipe(team, loaded, 1, out)


def in_turn(sides: list | tuple, round_: int) -> list:
    """``sides`` in the order they run in round ``round_``: reversed every other round, so that
    neither always runs first (after the other's allocations, or into the machine's slow spell)."""
    return list(sides) if round_ % 2 == 0 else list(reversed(sides))


def max_diff(a: list, b: list) -> float:
    """The largest absolute difference between two lists of logprob tensors, paired."""
    return round(float(max((x - y).abs().max() for x, y in zip(a, b))), 4)


def parse_args(repeats: str, default_episodes: int, default_repeats: int, smoke_episodes: int,
               device: bool = False) -> argparse.Namespace:
    """--model, --episodes, ``--<repeats>`` and --smoke (tiny model, one repeat, ``smoke_episodes``);
    with ``device``, --device for the timed side's model (the rollouts stay on the CPU)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    if device:
        parser.add_argument("--device", default="auto", help="auto (a CUDA GPU where there is one), cpu, cuda, cuda:N")
    parser.add_argument("--episodes", type=positive_int, default=default_episodes)
    parser.add_argument(f"--{repeats}", type=positive_int, default=default_repeats, help="the sides alternate this many times")
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if device:  # now, not after minutes of rollouts
        try:
            resolve_device(args.device)
        except ValueError as exc:
            parser.error(f"--device {args.device}: {exc}")
    if args.smoke:
        args.model, args.episodes = "tiny", smoke_episodes
        setattr(args, repeats, 1)
    return args


def role_datums_of_step(recipe: str, loaded: LoadedModel, episodes: int, out: Path) -> dict[str, list[list]]:
    """A recipe's ``episodes`` episodes rolled out once on ``loaded``: per trainable role, each
    episode's datums, advantages alternating in sign between episodes (a step's worth of real
    prompts and replies; the values do not matter to a pass's cost)."""
    from orchestrator.training.datums import role_datums
    from orchestrator.team import trainable_roles

    team = load_team(RECIPES / f"{recipe}.yaml")
    result, _ = run_recipe(team, loaded, episodes, out, concurrency=episodes)
    return {role: [role_datums(e, role, 1.0 if e.index % 2 else -1.0) for e in result.episodes]
            for role in trainable_roles(team.roles)}
