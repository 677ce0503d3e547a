"""``rolecast eval RECIPE``: play N episodes and report per role win/draw/loss rates with 95%
intervals (``evaluation.py``), against a rebound opponent if asked."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import RolecastError
from .flags import (
    add_episode_flags, add_model_flags, add_policy_flag, add_ray_flags, compute_options, exit_code, parse_adapter_flags,
    episodes_title, out_dir, parse_policy_flags, positive_int, print_table, shows_progress, statuses, stdout_console,
)


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
    p.add_argument("--out", type=out_dir, help="run dir (default: runs/eval-<team>-<time>; --population: RUN_DIR/population)")
    add_episode_flags(p, json_help="print the report as JSON")
    add_ray_flags(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from .. import api

    if args.population:
        from . import eval_population

        if ignored := [f for f, v in (("--held-out", args.held_out), ("--episodes", args.episodes)) if v]:
            raise RolecastError(f"--population plays --games-per-pair games a pair: drop {', '.join(ignored)}")
        if args.ray is not None or args.rollout_workers is not None:  # the workers alone too: ignored, unsaid
            raise RolecastError("--ray and --rollout-workers play plain evaluations; --population plays its round "
                                "robin in this process")
        return eval_population.handle(args, api.load_team(args.recipe))
    if ignored := [f for f, v in (("--baseline", args.baseline), ("--games-per-pair", args.games_per_pair)) if v]:
        raise RolecastError(f"{', '.join(ignored)}: only with --population RUN_DIR")
    evaluation = api.evaluate(args.recipe, episodes=args.episodes, held_out=args.held_out, opponent=args.opponent,
                              out=args.out, seed=args.seed, concurrency=args.concurrency, timeout=args.timeout,
                              policies=parse_policy_flags(args.policy), adapters=parse_adapter_flags(args.adapter),
                              progress=shows_progress(args), **compute_options(args))
    if args.json:
        print(json.dumps(evaluation.report))
    else:
        print_report(evaluation.report)
    return exit_code(evaluation.run)


def print_report(report: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    title = episodes_title(report)
    if report["opponent"]:
        title += f", opponent {report['opponent']['role']} = {report['opponent']['policy']}"
    table = Table(title=escape(title))  # a checkpoint:PATH opponent's "[...]" is text too
    for col in ("role", "policy", "W-D-L", "win rate", "95% CI", "mean reward"):
        # a binding folds where the table is too wide; a role name or a figure, cut, would mislead
        folds = col == "policy"
        table.add_column(col, justify="left" if col in ("role", "policy") else "right", no_wrap=not folds,
                         overflow="fold", min_width=len(col) if folds else None)
    for name, e in report["roles"].items():
        lo, hi = e["win_ci95"]
        reward = "-" if e["mean_reward"] is None else \
            f"{e['mean_reward']:.3f}" + ("" if e["reward_ci95"] is None else f" ±{e['reward_ci95']:.3f}")
        table.add_row(name, escape(report["bindings"][name]), f"{e['win']}-{e['draw']}-{e['loss']}",
                      f"{e['win_rate']:.3f}", f"{lo:.3f}-{hi:.3f}", reward)
    console = stdout_console()
    print_table(console, table)
    if not report["roles"]:  # every episode stopped (max_turns) or failed: an empty table, unsaid
        console.print(f"no episode ended with a result ({statuses(report)}): W-D-L counts finished games only",
                      highlight=False, markup=False)
    if report["env"]:
        # an env's own metric names: acc[easy] is no style
        console.print(", ".join(f"{k} {v}" for k, v in report["env"].items()), highlight=False, markup=False)
    # not markup: a path (runs/exp[lr=1e-4]) lost its "[...]" or raised a MarkupError after the run
    console.print(f"win rate = success rate in one-player games; run dir: {report['run_dir']}", highlight=False, markup=False,
                  soft_wrap=True)  # the path whole on its line, for a script or a copy: the terminal wraps it
    if report["illegal_baseline"]:
        console.print(f"not a baseline: builtin:random ({', '.join(report['illegal_baseline'])}) cannot see this game's "
                      "legal moves", highlight=False)
