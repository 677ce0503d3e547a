"""``rolecast report RUN_DIR``: PNG curves of a training run and a summary table; for a population
run evaluated with ``rolecast eval --population``, the payoff heatmap too."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import yaml

from ..errors import RolecastError
from ..files import read_yaml
from .metrics import read_metrics

# (file, title, metric-name prefixes plotted on it)
PLOTS = [
    ("reward.png", "mean reward per role (train rollouts; env_reward: the game's own; turn_score: its moves' scores)",
     ("reward/", "env_reward/", "turn_score/")),
    ("eval.png", "evaluation reward per role (95% interval)", ("eval_reward/",)),
    ("loss.png", "loss per adapter", ("/loss",)),
    ("kl.png", "how far the policy moved: KL to the base model, sampler-to-current KL (approx_kl), "
     "importance ratio, PPO clip fraction", ("/kl", "/approx_kl", "/ratio_mean", "/clip_fraction")),
    ("win_rate.png", "win rates (self-play, population; eval_: against the evaluation opponent)",
     ("win_rate/", "eval_win_rate/")),
    ("elo.png", "Elo ratings (learners and snapshots)", ("elo/",)),
    ("env.png", "the environment's own measures at each evaluation (Env.outcome_metrics)", ("eval_env/",)),
]


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(key.startswith(p) if p.endswith("/") else key.endswith(p) for p in patterns)


def write_report(run_dir: Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        raise RolecastError(f"{run_dir / 'metrics.jsonl'}: no rows yet (the run has not finished its first evaluation)")
    out_dir = run_dir / "report"
    if out_dir.exists() and not out_dir.is_dir():
        raise RolecastError(f"{out_dir} is a file: the report goes in a folder of that name")
    out_dir.mkdir(exist_ok=True)
    written = []
    for filename, title, patterns in PLOTS:
        keys = sorted({k for r in rows for k, v in r.items() if _matches(k, patterns) and _number(v)})
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        lines = []
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if _number(r.get(key))]
            xs, ys = zip(*pts)
            lines += ax.plot(xs, ys, marker="o", markersize=3)
            if key.startswith("eval_reward/"):
                ci_key = _ci_key(key)
                ci = [r[ci_key] if _number(r.get(ci_key)) else 0.0 for r in rows if _number(r.get(key))]
                ax.fill_between(xs, [y - c for y, c in zip(ys, ci)], [y + c for y, c in zip(ys, ci)], alpha=0.2)
        # on one line the longer titles ran off both sides of the figure
        ax.set_title(textwrap.fill(title, 64, break_on_hyphens=False))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(lines, keys, fontsize=8)  # labels given, not set: a curve's label="_coder/loss" is left out
        fig.tight_layout()
        fig.savefig(out_dir / filename, dpi=110)
        plt.close(fig)
        written.append(str(out_dir / filename))
    population = run_dir / "population" / "population.json"
    if population.is_file():
        written.append(str(heatmap_of(population, out_dir)))
    evals = [r for r in rows if r.get("kind") == "eval"]
    then = _run_options(run_dir)
    summary = {"run_dir": str(run_dir), "steps": max((r["step"] for r in rows), default=0),
               "steps_planned": then["steps"] if type(then.get("steps")) is int else None, "plots": written}
    if evals:
        first, last = evals[0], evals[-1]
        summary["eval"] = {
            k.split("/", 1)[1]: {
                "first": first.get(k), "first_ci95": first.get(_ci_key(k)),
                "last": last.get(k), "last_ci95": last.get(_ci_key(k)),
                "first_step": first["step"], "last_step": last["step"],
            }
            for k in last if k.startswith("eval_reward/")
        }
    lines = ["| role | eval reward (first step) | eval reward (last step) |", "| --- | --- | --- |"]
    for role, e in summary.get("eval", {}).items():
        lines.append(f"| {role} | {_shown(e['first'], e['first_ci95'])} (step {e['first_step']}) | "
                     f"{_shown(e['last'], e['last_ci95'])} (step {e['last_step']}) |")
    # the table's rewards are over the finished episodes: say where some errored or timed out
    failed = {r["step"]: (sum(r[k] for k in ("episodes_errored", "episodes_timed_out") if _number(r.get(k))), r.get("episodes"))
              for r in evals[:1] + evals[-1:]}
    if said := [f"{n} of {of} at step {step}" for step, (n, of) in failed.items() if n]:
        lines.append(f"\nEvaluation episodes that errored or timed out, in no eval reward: {', '.join(said)}.")
    planned = summary["steps_planned"]
    if planned and not any(r["step"] == planned for r in evals):  # the final evaluation is the last row written
        # a strategy of `rolecast compare` trained a changed recipe (trainer, adapters): compare resumes it
        again = (f"rolecast compare RECIPE --out {run_dir.absolute().parent} --strategy {then['strategy']}"
                 if then.get("strategy") else f"rolecast train RECIPE --out {run_dir} --resume")
        # no lock says whether it still trains: a second process resuming a live run would write over it
        lines.append(f"\nThe run is at step {summary['steps']} of {planned}, still training or stopped; if it stopped, "
                     f"`{again}` continues it from its last checkpoint.")
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary["table"] = "\n".join(lines)
    return summary


def _ci_key(reward_key: str) -> str:
    """``eval_reward/ROLE``'s interval: ``eval_ci95/ROLE`` (a role may be named ``reward_model``)."""
    return "eval_ci95/" + reward_key.removeprefix("eval_reward/")


def _run_options(run_dir: Path) -> dict[str, Any]:
    """The run options its config.yaml records (``steps``: those it was started, or last resumed,
    for; ``strategy``: a `rolecast compare` run's); none where it is missing or damaged."""
    try:
        run = read_yaml(run_dir / "config.yaml")["run"]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError):
        return {}
    return run if isinstance(run, dict) else {}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(mean: Any, ci: Any) -> str:
    if not _number(mean):
        return "n/a"
    return f"{mean:.3f} ± {ci:.3f}" if _number(ci) else f"{mean:.3f}"


def heatmap_of(population: Path, out_dir: Path) -> Path:
    """``out_dir/payoff.png``, the heatmap of the round robin in ``population`` (a population.json)."""
    try:
        return payoff_heatmap(json.loads(population.read_text(encoding="utf-8")), out_dir / "payoff.png")
    except (ValueError, KeyError, TypeError) as exc:
        raise RolecastError(f"{population}: not a round robin's report ({type(exc).__name__}: {exc}); "
                            "`rolecast eval --population` writes it again") from None


def payoff_heatmap(report: dict[str, Any], path: Path) -> Path:
    """The round robin's payoff matrix (row entrant's mean reward against the column's), annotated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [e["name"] for e in report["entrants"]]
    cells = [[report["payoff"][a][b] for b in names] for a in names]
    values = [[float("nan") if v is None else v for v in row] for row in cells]
    bound = max((abs(v) for row in cells for v in row if v is not None), default=1.0) or 1.0
    size = 1.0 + 0.7 * len(names)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(values, cmap="RdBu", vmin=-bound, vmax=bound)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for i, row in enumerate(cells):
        for j, v in enumerate(row):
            if v is not None:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    # two lines: a figure for five entrants is too narrow for one
    ax.set_title(f"{report['team']}\nrow's mean reward against column, {report['games_per_pair']} games a pair",
                 fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
