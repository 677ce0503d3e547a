"""``rolecast train RECIPE``: train the recipe's trainable roles, each its own LoRA adapter."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .. import logs
from .flags import add_training_flags, compute_options, out_dir, parse_sets, positive_int, shows_progress


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="train the recipe's trainable roles (each its own LoRA adapter)")
    p.add_argument("recipe", type=Path, help="team YAML with a `training:` block")
    p.add_argument("--steps", type=positive_int, help="training steps (default: the recipe's)")
    p.add_argument("--out", type=out_dir, help="run dir (default: runs/train-<recipe>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add_training_flags(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from .. import api

    trained = api.train(args.recipe, steps=args.steps, sets=parse_sets(args.sets), out=args.out,
                        resume=args.resume, seed=args.seed, progress=shows_progress(args), **compute_options(args))
    print(json.dumps(trained.final))
    logs.say(f"run dir: {trained.run_dir}")
    return 0
