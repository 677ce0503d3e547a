"""``rolecast run TEAM``: run episodes of a team and summarise them per role."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .. import logs
from .flags import (
    add_episode_flags, add_model_flags, add_policy_flag, add_ray_flags, compute_options, exit_code, parse_adapter_flags,
    episodes_title, out_dir, parse_policy_flags, positive_int, print_table, shows_progress, stdout_console,
)


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run episodes of a team")
    p.add_argument("team", type=Path, help="team or recipe YAML")
    p.add_argument("--episodes", type=positive_int, help="number of episodes (default: the team's `episodes`)")
    p.add_argument("--task", action="append", default=[], metavar="TASK",
                   help="run these tasks instead of the team's (repeatable; the protocol says what TASK means)")
    p.add_argument("--out", type=out_dir, help="run dir (default: runs/<team>-<time>)")
    add_policy_flag(p)
    add_model_flags(p)
    add_episode_flags(p, json_help="print the summary as JSON on stdout")
    add_ray_flags(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from .. import api

    result = api.run(args.team, episodes=args.episodes, tasks=args.task or None, out=args.out, seed=args.seed,
                     concurrency=args.concurrency, timeout=args.timeout, policies=parse_policy_flags(args.policy),
                     adapters=parse_adapter_flags(args.adapter), progress=shows_progress(args), **compute_options(args))
    transcripts = f"transcripts: {result.run_dir / 'transcripts.jsonl'}"
    if args.json:
        print(json.dumps(result.summary))
        logs.say(transcripts)
    else:
        print_summary(result.summary)
        print(transcripts)
    return exit_code(result)


def print_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=episodes_title(summary))
    for col in ("role", "mean reward", "±95%", "turns", "invalid", "retries"):
        # whole, as eval's: in a narrow terminal rich cut them all ("-0.…" for a mean reward, "gu…" for a role)
        table.add_column(col, justify="left" if col == "role" else "right", no_wrap=True)
    for name, r in summary["roles"].items():
        ci = "" if r["reward_ci95"] is None else f"{r['reward_ci95']:.3f}"
        mean = "-" if r["mean_reward"] is None else f"{r['mean_reward']:.3f}"  # None: it took part in no finished episode
        table.add_row(name, mean, ci, str(r["turns"]), str(r["invalid_turns"]), str(r["retries"]))
    console = stdout_console()
    print_table(console, table)
    console.print(
        f"valid turns {summary['valid_turn_rate']}, first-try valid {summary['first_try_valid_rate']}, "
        f"{summary['generated_tokens']} tokens generated in {summary['wall_s']}s"
    )
    if summary["env"]:
        # an env's own metric names: acc[easy] is no style
        console.print(", ".join(f"{k} {v}" for k, v in summary["env"].items()), highlight=False, markup=False)
