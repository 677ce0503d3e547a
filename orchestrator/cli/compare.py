"""``rolecast compare RECIPE``: train one recipe several ways (``training/strategies.py``) with the
same seed and budget, then put their held-out evaluation curves side by side.

Each strategy trains in ``OUT/<strategy>/`` (a normal run dir); a strategy whose run has a
checkpoint resumes from it (one that stopped before its first checkpoint starts over), so an
interrupted comparison goes on where it stopped, and a strategy that starts in it takes the
model, dtype, seed and steps its runs there were started with unless given (another model, seed
or training option than theirs is refused); a strategy's folder
that holds other files is refused before anything trains, as is an ``OUT`` holding a run of
another recipe, or one that is a run dir itself. ``OUT`` gets
``compare.json`` (per strategy and evaluation step: each role's mean environment reward and its
95% interval) and ``compare.png``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from ..errors import RolecastError
from ..launch import LOCK_FILE, Compute, claimed, recorded_run, run_dir
from ..team import Team, trainable_roles
from ..files import write_atomic
from .flags import add_training_flags, compute_options, out_dir, parse_sets, positive_int, shows_progress


def register(sub: Any) -> None:
    from ..training.strategies import STRATEGIES

    p = sub.add_parser("compare", help="train a recipe several ways and compare held-out curves")
    p.add_argument("recipe", type=Path, help="team YAML with a `training:` block")
    p.add_argument("--strategy", action="append", choices=list(STRATEGIES), metavar="NAME",
                   help=f"repeatable; default: all of {', '.join(STRATEGIES)}")
    p.add_argument("--steps", type=positive_int, help="training steps per strategy (default: the recipe's)")
    p.add_argument("--every", type=positive_int,
                   help="freeze-rotate: steps per phase (default: what its run in OUT was started with, else 5, "
                        "or fewer where the steps would leave an adapter no phase)")
    p.add_argument("--out", type=out_dir, help="where the runs go (default: runs/compare-<recipe>-<time>)")
    add_training_flags(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..api import as_started, load_team, steps_given, train_into
    from ..training.strategies import STRATEGIES, with_strategy

    if args.every is not None and "freeze-rotate" not in (args.strategy or STRATEGIES):  # else ignored, unsaid
        raise RolecastError("--every is freeze-rotate's phase length: only with --strategy freeze-rotate")
    sets = parse_sets(args.sets)
    if taken := next((key for key in sets if key.startswith("trainer_config.")), None):  # with_strategy replaces them
        raise RolecastError(f"--set {taken}: each strategy sets its trainer's options (freeze-rotate's every is --every)")
    base = load_team(args.recipe, sets)
    if base.config.training is None:
        raise RolecastError(f"{base.path}: the recipe has no `training:` block")
    theirs = sorted({s["trainer"] for s in STRATEGIES.values()})
    if (trainer := base.config.training.trainer) not in theirs:  # self-play's pool, a population's members: gone
        raise RolecastError(f"{base.path}: trains with {trainer!r}, which every strategy would replace by one of "
                            f"{', '.join(theirs)}, dropping what it does: compare a recipe trained with one of those")
    out = run_dir(args.out, f"compare-{base.name}", fresh=True)  # a run dir itself: its strategies would sit among its files
    with claimed(out):  # a second comparison into it would train its strategies over ours
        # compare.json sets every run in OUT side by side: one of another recipe would stand among ours
        for folder in sorted(p for p in out.iterdir() if (p / "metrics.jsonl").is_file()):
            recipe = ((recorded_run(folder) or {}).get("recipe") or {}).get("name", base.name)
            if recipe != base.name:
                raise RolecastError(f"{folder} is a run of recipe {recipe!r}, not {base.name!r}: give another --out")
        runs = []
        given = Compute(**compute_options(args)), args.seed, steps_given(base, sets, args.steps)
        starting = None  # what a strategy starting now trains with: the same for each, worked out once
        # all checked before any trains: nothing of the user's is overwritten, and a started run (its
        # config.yaml) goes on from its last checkpoint (from step 0 without one) only as it was started
        for name in dict.fromkeys(args.strategy or STRATEGIES):  # a strategy named twice is one run
            where, resume = out / name, (out / name / "config.yaml").is_file()
            # a lock file alone is what a run killed before its config.yaml leaves: no file of the user's
            if not resume and where.exists() and (not where.is_dir() or any(p.name != LOCK_FILE for p in where.iterdir())):
                what = "holds files but no training run" if where.is_dir() else "is a file, where its run dir goes"
                raise RolecastError(f"{where} {what}: move it, or give another --out")
            if resume:  # one that goes on was checked as it started
                team = with_strategy(base, name, args.every or phase_of(where) or 5)
                compute, seed, steps = as_started(team, where, *given)
            else:
                compute, seed, steps = starting = starting or as_begun(base, name, out, *given)
                total = steps or base.config.training.steps
                team = with_strategy(base, name, args.every or default_every(base, total))
                if name == "freeze-rotate":
                    check_rotation(team, total)
            runs.append((name, team, where, compute, seed, steps, resume))
        for name, team, where, compute, seed, steps, resume in runs:
            train_into(team, where, compute, seed=seed, steps=steps, resume=resume, progress=shows_progress(args),
                       extra={"strategy": name})
        print(json.dumps(write_comparison(out, list(base.roles))))
    return 0


def as_begun(base: Team, name: str, out: Path, compute: Compute, seed: int | None,
             steps: int | None) -> tuple[Compute, int | None, int | None]:
    """What strategy ``name``, starting now, trains with: where this command gives no model, dtype,
    seed or steps, those the comparison's runs in ``out`` were started with (compare.json sets it
    beside them, as one budget; the recipe's would differ from an earlier --steps or --seed), and
    one they were started with unlike each other is one line; so is another model, seed, recipe
    edit or training option than a begun run's own, as its resume would refuse."""
    from ..api import as_started
    from ..training.strategies import STRATEGIES, with_strategy

    recorded = {p: recorded_run(p) or {} for p in sorted(out.iterdir())
                if p.name in STRATEGIES or (p / "metrics.jsonl").is_file()}
    runs = [r.get("run") or {} for p, r in recorded.items() if (p / "metrics.jsonl").is_file()]

    def then(flag: str, given: Any) -> Any:
        if given not in (None, "auto") or not (values := {run[flag] for run in runs if run.get(flag) is not None}):
            return given
        if len(values) > 1:
            raise RolecastError(f"{out}: its runs were started with different --{flag} "
                                f"({', '.join(sorted(map(str, values)))}): give --{flag} for the strategies that start now")
        return values.pop()

    compute = dataclasses.replace(compute, model=then("model", compute.model), dtype=then("dtype", compute.dtype))
    seed = then("seed", seed)
    for other, record in recorded.items():  # compare.json sets it beside them: one recipe, one seed, the same options
        if other.name in STRATEGIES and "recipe" in record:
            try:
                as_started(with_strategy(base, other.name, phase_of(other) or 5), other, compute, seed, None)
            except RolecastError as exc:
                raise RolecastError(f"{name} would train unlike the comparison's runs: "
                                    f"{str(exc).removeprefix('--resume: ')}") from None
    return compute, seed, then("steps", steps)


def phase_of(run: Path) -> int | None:
    """The ``every`` that freeze-rotate's run in ``run`` was started with (a resume without --every
    goes on with it, as with the model and steps); None where it records none."""
    training = ((recorded_run(run) or {}).get("recipe") or {}).get("training")
    options = training.get("trainer_config") if isinstance(training, dict) else None
    return options.get("every") if isinstance(options, dict) else None


def default_every(team: Team, steps: int) -> int:
    """freeze-rotate's phase length where --every is not given: 5 steps, fewer where ``steps`` would
    leave an adapter no phase (a short comparison rotates every step)."""
    adapters = len(set(trainable_roles(team.roles).values()))
    return max(1, min(5, steps // adapters))


def check_rotation(team: Team, steps: int) -> None:
    """Every adapter gets a phase of freeze-rotate's run (one adapter for ``every`` steps each, in
    team order): with phases longer than ``steps`` allow, its curves would be of the others alone."""
    every = team.config.training.trainer_config["every"]
    if idle := list(dict.fromkeys(trainable_roles(team.roles).values()))[math.ceil(steps / every):]:
        raise RolecastError(f"--every {every} over {steps} steps: freeze-rotate would never train {', '.join(idle)} "
                            "(one adapter a phase): give a smaller --every, or more --steps")


def write_comparison(out: Path, roles: list[str]) -> dict[str, Any]:
    """compare.json and compare.png from the strategies' run dirs under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..training.metrics import read_metrics

    result: dict[str, Any] = {"run_dir": str(out), "strategies": {}}
    fig, axes = plt.subplots(1, len(roles), figsize=(6 * len(roles), 4), squeeze=False)
    for folder in sorted(p for p in out.iterdir() if (p / "metrics.jsonl").exists()):
        evals = [r for r in read_metrics(folder) if r.get("kind") == "eval"]
        curves = {role: [{"step": r["step"], "reward": r[f"eval_reward/{role}"], "ci95": r.get(f"eval_ci95/{role}")}
                         for r in evals if r.get(f"eval_reward/{role}") is not None] for role in roles}
        result["strategies"][folder.name] = curves
        for ax, role in zip(axes[0], roles):
            points = curves[role]
            if not points:
                continue
            xs = [p["step"] for p in points]
            ys = [p["reward"] for p in points]
            ax.plot(xs, ys, marker="o", markersize=3, label=folder.name)
            ci = [p["ci95"] or 0.0 for p in points]  # None: one episode, no interval to draw
            ax.fill_between(xs, [y - c for y, c in zip(ys, ci)], [y + c for y, c in zip(ys, ci)], alpha=0.15)
    for ax, role in zip(axes[0], roles):
        ax.set_title(f"{role}: held-out reward (95% interval)")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:  # say why the panel is empty, where matplotlib would only warn of a legend with nothing in it
            ax.text(0.5, 0.5, "no held-out evaluations", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=110)
    plt.close(fig)
    write_atomic(out / "compare.json", json.dumps(result, indent=2))
    return result
