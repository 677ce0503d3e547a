"""Score propose_solve Solvers on one fixed set of problems, through the Python API.

A propose_solve run's held-out Solver reward is measured on its own Proposer's puzzles, which
differ from run to run (one Proposer settles on `0 + 0`, another on `9 * 9`), so it cannot
compare Solvers. Here a Python function plays the Proposer, posing the same problems to each
Solver: the base model's and each run's trained adapter.

    python examples/fixed_problems.py runs/propose-solve [RUN_DIR ...] [--problems 64] [--model tiny]

One JSON line per Solver: the share of its tries that were right, with a 95% interval.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import rolecast

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "propose_solve.yaml"


def problems(n: int, seed: int = 0) -> list[dict]:
    """``n`` problems of the recipe's kinds: sums and differences of numbers up to 99, products
    of a number up to 99 by one up to 12."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        op = rng.choice("+-*")
        out.append({"a": rng.randint(0, 99), "op": op, "b": rng.randint(0, 12 if op == "*" else 99)})
    return out


def fresh(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3`` ... where it holds an earlier evaluation: ``evaluate`` refuses
    a run dir that holds one, which a second run of this script would otherwise hit (a traceback,
    after the base model's evaluation)."""
    out, n = path, 1
    while out.exists():
        n += 1
        out = path.with_name(f"{path.name}-{n}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="propose_solve training run dirs")
    parser.add_argument("--problems", type=int, default=64, help="how many problems (default 64)")
    parser.add_argument("--model", help="the base model (default: the recipe's)")
    args = parser.parse_args()
    posed = problems(args.problems)

    def proposer(request):  # the same problem for the same episode index, in every evaluation
        return json.dumps(posed[request.episode_index % len(posed)])

    for run in [None, *args.runs]:
        adapters = {"solver": run / "sampler" / "solver"} if run else None
        out = fresh(run / "fixed-problems") if run else None  # the base model's: runs/eval-propose_solve-<time>
        report = rolecast.evaluate(RECIPE, episodes=len(posed), policies={"proposer": proposer}, adapters=adapters,
                                   out=out, model=args.model, progress=False).report
        solver = report["roles"]["solver"]
        print(json.dumps({"solver": str(run) if run else "base model", "problems": len(posed),
                          "right": solver["mean_reward"], "ci95": solver["reward_ci95"]}), flush=True)


if __name__ == "__main__":
    main()
