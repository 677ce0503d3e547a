"""Training episodes per second with Ray rollout workers, synchronous and async, against the
single-process run, in one invocation.

Each configuration trains the same recipe from the same seed for ``--steps`` steps; the figure is
training episodes over the summed ``step_s`` of its metrics (rollout, rewards, update and
publishing; the evaluations and the start-up are left out). Configurations:

    single             rolecast train, no Ray (the baseline)
    ray-N              --ray --rollout-workers N, max_staleness 0: workers idle while the driver trains
    ray-N-async        the same with max_staleness 1: the next step's episodes sample meanwhile

Every configuration runs on ``--device`` (default ``cpu``): each worker is a process with its
own engine and one CPU thread (with ``cuda``, a GPU of its own: as many workers as GPUs), the
driver trains there, and the single process samples and trains there. On a machine with fewer
cores than workers + trainer the workers only share the cores the single process already used,
so the ratio says what the overlap buys there, not at scale.

    python benchmarks/scale.py [--model smollm2-135m] [--recipe recipes/code_pair.yaml] [--steps 3]
                               [--workers 1 2] [--device cpu] [--smoke]

``--smoke``: the tiny model, one step, 1 worker sync and async (tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

from orchestrator.cli.flags import positive_int

ROOT = Path(__file__).resolve().parent.parent


def train(args: argparse.Namespace, out: Path, extra: list[str]) -> float:
    """Training episodes per second of one configuration."""
    from orchestrator.cli import main

    with contextlib.redirect_stdout(sys.stderr):  # its final row: this script's stdout is its own JSON line
        code = main(["train", str(ROOT / args.recipe), "--model", args.model, "--steps", str(args.steps), "--seed", "0",
                     "--out", str(out), "--no-progress", "--dtype", "float32", "--device", args.device,
                     "--set", "eval_every=0", "--set", "eval_episodes=1", "--set", f"group_size={args.group_size}",
                     "--set", f"groups_per_step={args.groups}", *extra])
    if code != 0:
        sys.exit(f"training {' '.join(extra) or 'single'} failed with exit code {code}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r.get("kind") == "train"]
    return sum(r["episodes"] for r in train_rows) / sum(r["step_s"] for r in train_rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--recipe", default="recipes/code_pair.yaml")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--group-size", type=positive_int, default=8)
    parser.add_argument("--groups", type=positive_int, default=2, help="groups per step")
    parser.add_argument("--workers", type=positive_int, nargs="+", default=[1, 2])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: workers, trainer and the single process")
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.steps, args.group_size, args.groups, args.workers = "tiny", 1, 2, 2, [1]
    import ray

    from orchestrator.workers import start_env

    start_env()
    ray.init(num_cpus=max(os.cpu_count() or 1, max(args.workers)), include_dashboard=False, log_to_driver=False)
    results: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
            results["single"] = train(args, Path(tmp) / "single", [])
            for n in args.workers:
                ray_flags = ["--ray", "--rollout-workers", str(n)]
                results[f"ray-{n}"] = train(args, Path(tmp) / f"ray-{n}", ray_flags)
                results[f"ray-{n}-async"] = train(args, Path(tmp) / f"ray-{n}-async", ray_flags + ["--set", "max_staleness=1"])
                print(json.dumps({k: round(v, 3) for k, v in results.items()}), file=sys.stderr)
    finally:
        ray.shutdown()
    base = results["single"]
    print(json.dumps({
        "model": args.model, "recipe": args.recipe, "steps": args.steps,
        "episodes_per_step": args.group_size * args.groups, "device": args.device, "cpus": os.cpu_count(),
        "episodes_per_s": {k: round(v, 3) for k, v in results.items()},
        "ratio_to_single": {k: round(v / base, 3) for k, v in results.items() if k != "single"},
    }))


if __name__ == "__main__":
    main()
