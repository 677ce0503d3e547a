"""``rolecast eval RECIPE``: play N episodes and report per role win/draw/loss rates with 95%
intervals (``evaluation.py``), against a rebound opponent if asked."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import structlog

from ..errors import RolecastError
from ..evaluation import CHECKPOINT_ADAPTER, bind_opponent, blind_random_roles, evaluate
from .flags import (
    add_episode_flags, add_model_flags, add_policy_flag, add_ray_flags, parse_adapter_flags, parse_policy_flags, play,
    exit_code, policies_and_workers, positive_int, run_dir,
)

log = structlog.get_logger()


def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="win/draw/loss (or success) rates with 95%% intervals, per role")
    p.add_argument("recipe", type=Path, help="team or recipe YAML")
    p.add_argument("--episodes", type=positive_int, help="episodes to play (default 100)")
    p.add_argument("--held-out", action="store_true",
                   help="play the recipe's held-out tasks (training.eval_tasks) instead of its tasks")
    add_policy_flag(p, help="bind a role, as for `rolecast run` (repeatable)")
    p.add_argument("--opponent", metavar="OPPONENT",
                   help="rebind the recipe's opponent role: random, minimax (any builtin), base, or checkpoint:PATH")
    add_model_flags(p)
    p.add_argument("--population", type=Path, metavar="RUN_DIR",
                   help="a round robin among a population run's members, snapshots and --baseline policies")
    p.add_argument("--baseline", action="append", default=[], metavar="NAME",
                   help="--population: a builtin policy that joins the round robin (repeatable; default: random)")
    p.add_argument("--games-per-pair", type=positive_int, help="--population: games each pair plays (default 20)")
    p.add_argument("--out", type=Path, help="run dir (default: runs/eval-<team>-<time>; --population: RUN_DIR/population)")
    add_episode_flags(p, json_help="print the report as JSON")
    add_ray_flags(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..rollout import RunOptions
    from ..team import load_team

    team = load_team(args.recipe)
    if args.population:
        from . import eval_population

        if ignored := [f for f, v in (("--held-out", args.held_out), ("--episodes", args.episodes)) if v]:
            raise RolecastError(f"--population plays --games-per-pair games a pair: drop {', '.join(ignored)}")

        if args.ray is not None:
            raise RolecastError("--ray plays plain evaluations; --population plays its round robin in this process")
        return eval_population.handle(args, team)
    if ignored := [f for f, v in (("--baseline", args.baseline), ("--games-per-pair", args.games_per_pair)) if v]:
        raise RolecastError(f"{', '.join(ignored)}: only with --population RUN_DIR")
    if args.held_out:
        if team.eval_tasks is None:
            raise RolecastError(f"--held-out: {team.path} has no training.eval_tasks")
        team = dataclasses.replace(team, tasks=team.eval_tasks)
    overrides = parse_policy_flags(args.policy)
    adapters = parse_adapter_flags(args.adapter)
    opponent_role, checkpoint = None, None
    if args.opponent:
        team, opponent_role, checkpoint = bind_opponent(team, args.opponent, overrides)
    cfg = team.config
    model = args.model or cfg.model
    seed = cfg.seed if args.seed is None else args.seed

    policies, workers = policies_and_workers(args, team, overrides, model, seed, adapters,
                                             {CHECKPOINT_ADAPTER: checkpoint} if checkpoint else None)
    bindings = {name: str(overrides.get(name) or spec.binding or f"model ({spec.config.policy.adapter or 'base'})")
                for name, spec in team.roles.items()}
    blind = blind_random_roles(team, bindings)
    if blind:
        log.warning("builtin:random is no baseline here: the game lists no legal moves, so it sends random words "
                    "and loses", team=team.name, roles=blind)
    out = run_dir(args.out, f"eval-{team.name}", fresh=True)
    options = RunOptions(episodes=args.episodes or 100, seed=seed, out_dir=out, concurrency=args.concurrency or cfg.concurrency,
                         episode_timeout_s=cfg.episode_timeout_s, progress=not (args.no_progress or args.json),
                         extra={"eval": True, "model": model, "device": args.device, "policy": args.policy, "opponent": args.opponent,
                                "adapter": args.adapter, "ray": args.ray})
    result = play(team, policies, options, workers, overrides)
    report = {"team": team.name, "episodes": len(result.episodes), "status": result.summary["status"],
              "opponent": {"role": opponent_role, "policy": args.opponent} if opponent_role else None,
              "bindings": bindings, "roles": evaluate(team, result.episodes, result.summary),
              "env": result.summary["env"], "illegal_baseline": blind, "run_dir": str(result.run_dir)}
    (result.run_dir / "eval.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return exit_code(result)


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"{report['team']}: {report['episodes']} episodes {report['status']}"
    if report["opponent"]:
        title += f", opponent {report['opponent']['role']} = {report['opponent']['policy']}"
    table = Table(title=title)
    for col in ("role", "policy", "W-D-L", "win rate", "95% CI", "mean reward"):
        table.add_column(col, justify="left" if col in ("role", "policy") else "right", no_wrap=True)
    for name, e in report["roles"].items():
        lo, hi = e["win_ci95"]
        reward = f"{e['mean_reward']:.3f}" + ("" if e["reward_ci95"] is None else f" ±{e['reward_ci95']:.3f}")
        table.add_row(name, report["bindings"][name], f"{e['win']}-{e['draw']}-{e['loss']}", f"{e['win_rate']:.3f}",
                      f"{lo:.3f}-{hi:.3f}", reward)
    console = Console()
    console.print(table)
    if report["env"]:
        console.print(", ".join(f"{k} {v}" for k, v in report["env"].items()), highlight=False)
    console.print(f"win rate = success rate in one-player games; run dir: {report['run_dir']}", highlight=False)
    if report["illegal_baseline"]:
        console.print(f"not a baseline: builtin:random ({', '.join(report['illegal_baseline'])}) cannot see this game's "
                      "legal moves", highlight=False)
