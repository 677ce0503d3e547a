"""A population of learners versus single self-play on Rock-Paper-Scissors: how exploitable the
learnt move distributions are, and what a population costs per training episode.

For each seed, ``recipes/rps.yaml`` (self-play: one adapter, its snapshot pool) and
``recipes/rps_population.yaml`` (four members, PFSP matchmaking) train for the same number of
steps, so the same number of training episodes (16 a step in both). Then every trained adapter
plays ``--probe`` games as alice against ``builtin:random``, and its moves give its distribution
per round. The exploitability of a distribution p is the best response's expected payoff,

    max(p_scissors - p_paper, p_rock - p_scissors, p_paper - p_rock)

(win 1, loss -1): 0 at the uniform Nash mixture, 1 for a pure strategy; per round, then averaged
over the rounds. The population's mixture is the members' distributions averaged (a member drawn
uniformly each game). Cost: training episodes per second of rollout, the population's over
self-play's, from the two runs' metrics of the same seed in this invocation (``cost_ratio``; with
the training updates included, ``step_cost_ratio``), with the engine's prompt tokens computed and
reused and tokens decoded per episode beside it.

    python benchmarks/populations.py [--model smollm2-135m] [--seeds 3] [--steps 20] [--probe 64]
                                     [--set KEY=VALUE ...] [--population-set KEY=VALUE ...] [--smoke]

``--set`` options go to both runs (an entropy bonus: ``loss_config.entropy_coef=0.1``),
``--population-set`` to the population's only (members started apart: ``trainer_config.init_noise=0.3``).
``--temperature T`` samples both runs' training moves at T (exploration: a move the model plays 1%
of the time at 1.0 comes up far more often at 1.5); the probe games always play at the recipes'
1.0, so a higher T cannot flatten the measured distributions by itself.

``--smoke``: the tiny model, one seed, one step, 4 probe games (tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

from orchestrator.cli.flags import positive_int

ROOT = Path(__file__).resolve().parent.parent
MOVES = ("rock", "paper", "scissors")


def exploitability(dist: dict[str, float]) -> float:
    r, p, s = (dist.get(m, 0.0) for m in MOVES)
    return max(s - p, r - s, p - r)


def recipe_at(recipe: str, temperature: float | None, tmp: Path) -> Path:
    """``recipes/RECIPE``, or a copy whose roles sample at ``temperature``."""
    path = ROOT / "recipes" / recipe
    if temperature is None:
        return path
    data = yaml.safe_load(path.read_text())
    for role in data["roles"]:
        role.setdefault("policy", {}).setdefault("sampling", {})["temperature"] = temperature
    out = tmp / recipe
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def check_sets(recipes: dict[str, Path], args: argparse.Namespace) -> None:
    """Each run's --set and --population-set options, checked against its recipe before any trains:
    one the population's recipe refused stopped the benchmark only at that run, once self-play's
    had trained (minutes a step)."""
    from orchestrator.api import load_team
    from orchestrator.cli.flags import parse_sets
    from orchestrator.errors import RolecastError

    for name, extra in (("rps.yaml", []), ("rps_population.yaml", args.population_set)):
        try:
            load_team(recipes[name], parse_sets(args.set + extra))
        except RolecastError as exc:
            sys.exit(f"{name}: {exc}")


def train(recipe: Path, out: Path, args: argparse.Namespace, seed: int, extra: list[str]) -> None:
    from orchestrator.cli import main

    sets = [flag for item in args.set + extra for flag in ("--set", item)]
    with contextlib.redirect_stdout(sys.stderr):  # its final row: this script's stdout is its own JSON line
        code = main(["train", str(recipe), "--model", args.model, "--steps", str(args.steps),
                     "--seed", str(seed), "--out", str(out), "--no-progress", "--dtype", "float32",
                     "--set", "eval_every=0", "--set", "eval_episodes=2", "--set", f"checkpoint_every={args.steps}", *sets])
    if code != 0:
        sys.exit(f"training {recipe.name} (seed {seed}) failed with exit code {code}")


def move_distributions(adapters: dict[str, Path], args: argparse.Namespace, out: Path) -> dict[str, list[dict]]:
    """adapter -> per round, its move frequencies as alice against builtin:random."""
    from orchestrator.engines.load import load_engine
    from orchestrator.policies.binding import Binding
    from orchestrator.rollout import RunOptions, build_policies, run_team
    from orchestrator.team import load_team

    team = load_team(ROOT / "recipes/rps.yaml")
    engine = load_engine(args.model, "float32", 0, "hf", adapters, "cpu")
    policies = build_policies(team, {"bob": Binding("builtin", "random")}, lambda: engine)
    names = list(adapters)

    async def go():
        try:
            return await run_team(team, policies, RunOptions(
                episodes=args.probe * len(names), seed=0, out_dir=out, progress=False,
                adapters_for=lambda i: {"alice": names[i % len(names)]}))
        finally:
            await engine.aclose()

    counts = {n: [Counter() for _ in range(team.env_config.rounds)] for n in names}
    episodes = asyncio.run(go()).episodes
    if failed := [e for e in episodes if e.failed]:  # run_team only logs them
        sys.exit(f"probe games: {len(failed)} of {len(episodes)} failed: {failed[0].error}")
    for record in episodes:
        mine = [t.content["move"] for t in record.turns if t.role == "alice" and t.valid and t.content]
        for k, move in enumerate(mine[: team.env_config.rounds]):
            counts[names[record.index % len(names)]][k][move] += 1
    # a round without a valid move would read as exploitability 0, the Nash mixture's
    if empty := next(((n, k) for n, rounds in counts.items() for k, c in enumerate(rounds) if not c), None):
        sys.exit(f"probe games: {empty[0]} played no valid move in round {empty[1] + 1}")
    return {n: [{m: c[m] / sum(c.values()) for m in MOVES} for c in rounds] for n, rounds in counts.items()}


def score(rounds: list[dict[str, float]]) -> dict:
    per_round = [round(exploitability(d), 4) for d in rounds]
    return {"per_round": per_round, "mean": round(statistics.mean(per_round), 4),
            "distribution": [{m: round(d[m], 3) for m in MOVES} for d in rounds]}


def train_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "train"]


def episodes_per_s(run: Path, seconds: str = "rollout_s") -> float:
    """Training episodes per second of rollout (``rollout_s``) or of whole steps (``step_s``)."""
    rows = train_rows(run)
    return sum(r["episodes"] for r in rows) / sum(r[seconds] for r in rows)


def engine_per_episode(run: Path) -> dict[str, float]:
    """Prompt tokens computed and reused, and tokens decoded, per training episode (the engine's
    stats in each step's metrics): where a run's rollout time goes."""
    rows = train_rows(run)
    episodes = sum(r["episodes"] for r in rows)
    return {k: round(sum(r[f"engine/{k}"] for r in rows) / episodes, 1)
            for k in ("prefill_tokens", "prefix_hit_tokens", "decode_tokens")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seeds", type=positive_int, default=3)
    parser.add_argument("--steps", type=positive_int, default=20, help="training steps of each run (16 episodes a step unless --set changes it)")
    parser.add_argument("--probe", type=positive_int, default=64, help="games each trained adapter plays against random")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a training option for both runs (rolecast train --set), e.g. loss_config.entropy_coef=0.1")
    parser.add_argument("--population-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a training option for the population's run only, e.g. trainer_config.init_noise=0.3")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature of both runs' training games (the probe plays at 1.0)")
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.seeds, args.steps, args.probe, args.temperature = "tiny", 1, 1, 4, 1.5
        args.set, args.population_set = ["loss_config.entropy_coef=0.01"], ["trainer_config.init_noise=0.01"]
    seeds = []
    with tempfile.TemporaryDirectory(prefix="populations-") as tmp:
        recipes = {name: recipe_at(name, args.temperature, Path(tmp)) for name in ("rps.yaml", "rps_population.yaml")}
        check_sets(recipes, args)
        for seed in range(args.seeds):
            work = Path(tmp) / f"seed-{seed}"
            train(recipes["rps.yaml"], work / "self-play", args, seed, [])
            train(recipes["rps_population.yaml"], work / "population", args, seed, args.population_set)
            members = sorted((work / "population" / "sampler").iterdir())
            adapters = {"self-play": work / "self-play" / "sampler" / "player", **{m.name: m for m in members}}
            dists = move_distributions(adapters, args, work / "probe")
            mixture = [{m: statistics.mean(dists[p.name][k][m] for p in members) for m in MOVES}
                       for k in range(len(dists["self-play"]))]
            rollout = {run: episodes_per_s(work / run) for run in ("self-play", "population")}
            step = {run: episodes_per_s(work / run, "step_s") for run in rollout}
            result = {"seed": seed, "train_episodes": {run: sum(r["episodes"] for r in train_rows(work / run)) for run in rollout},
                      "self_play": score(dists["self-play"]), "population_mixture": score(mixture),
                      "members": {p.name: score(dists[p.name]) for p in members},
                      "rollout_episodes_per_s": {run: round(rollout[run], 3) for run in rollout},
                      "engine_per_episode": {run: engine_per_episode(work / run) for run in rollout},
                      "cost_ratio": round(rollout["population"] / rollout["self-play"], 3),
                      "step_cost_ratio": round(step["population"] / step["self-play"], 3)}
            print(json.dumps(result), file=sys.stderr)
            seeds.append(result)
    mixture = [s["population_mixture"]["mean"] for s in seeds]
    print(json.dumps({
        "model": args.model, "seeds": args.seeds, "steps": args.steps, "train_episodes": {run: statistics.mean(s["train_episodes"][run] for s in seeds) for run in seeds[0]["train_episodes"]},
        "set": args.set, "population_set": args.population_set, "temperature": args.temperature,
        "probe_games": args.probe, "per_seed": seeds,
        "self_play_exploitability": [s["self_play"]["mean"] for s in seeds],
        "population_exploitability": mixture,
        "best_member_exploitability": [min(m["mean"] for m in s["members"].values()) for s in seeds],
        "goal_met": all(p <= 0.15 and p < s["self_play"]["mean"] for p, s in zip(mixture, seeds)),
        "cost_ratio": round(statistics.mean(s["cost_ratio"] for s in seeds), 3),
        "step_cost_ratio": round(statistics.mean(s["step_cost_ratio"] for s in seeds), 3),
    }))


if __name__ == "__main__":
    main()
