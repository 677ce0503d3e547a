"""``rolecast report RUN_DIR``: plot a training run's curves (PNG) and print its summary."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import RolecastError


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="plot a training run's curves (PNG) and print its summary")
    p.add_argument("run_dir", type=Path, help="a `rolecast train` run dir (it holds metrics.jsonl), or a round robin's "
                   "folder (population.json: its payoff heatmap)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..training.report import heatmap_of, write_report

    if not args.run_dir.is_dir():  # "no metrics.jsonl (is this a training run dir?)" for a mistyped path
        raise RolecastError(f"{args.run_dir}: {'not a folder' if args.run_dir.exists() else 'no such folder'}")
    if not (args.run_dir / "metrics.jsonl").is_file() and (args.run_dir / "population.json").is_file():
        # a round robin's own folder (eval --population --out elsewhere): its heatmap beside it
        plot = str(heatmap_of(args.run_dir / "population.json", args.run_dir))
        print(json.dumps({"run_dir": str(args.run_dir), "plots": [plot]}) if args.json else f"plot: {plot}")
        return 0
    if not (args.run_dir / "metrics.jsonl").is_file():
        if (args.run_dir / "compare.json").is_file():
            hint = "a comparison: report one of its strategy folders, or see its compare.png"
        elif (args.run_dir / "evals").is_dir():
            hint = "the run stopped before its first evaluation finished"
        else:
            hint = "is this a training run dir?"
        raise RolecastError(f"{args.run_dir}: no metrics.jsonl ({hint})")
    summary = write_report(args.run_dir)
    if args.json:
        print(json.dumps(summary))
    else:
        print(summary["table"])
        for plot in summary["plots"]:
            print(f"plot: {plot}")
    return 0
