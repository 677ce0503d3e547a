"""``rolecast report RUN_DIR``: PNG curves of a training run and a summary table; for a population
run evaluated with ``rolecast eval --population``, the payoff heatmap too."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .metrics import read_metrics

# (file, title, metric-name prefixes plotted on it)
PLOTS = [
    ("reward.png", "mean reward per role (train rollouts; env_reward: the game's own)", ("reward/", "env_reward/")),
    ("eval.png", "evaluation reward per role (95% interval)", ("eval_reward/",)),
    ("loss.png", "loss per adapter", ("/loss",)),
    ("kl.png", "KL to the base model and importance ratio", ("/kl", "/ratio_mean")),
    ("win_rate.png", "win rates (self-play, population; eval_: against the evaluation opponent)",
     ("win_rate/", "eval_win_rate/")),
    ("elo.png", "Elo ratings (learners and snapshots)", ("elo/",)),
]


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(key.startswith(p) if p.endswith("/") else key.endswith(p) for p in patterns)


def write_report(run_dir: Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    out_dir = run_dir / "report"
    out_dir.mkdir(exist_ok=True)
    written = []
    for filename, title, patterns in PLOTS:
        keys = sorted({k for r in rows for k in r if _matches(k, patterns)})
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", markersize=3, label=key)
            ci_key = key.replace("eval_reward/", "eval_ci95/")
            if ci_key != key:
                ci = [r.get(ci_key, 0.0) for r in rows if key in r]
                ax.fill_between(xs, [y - c for y, c in zip(ys, ci)], [y + c for y, c in zip(ys, ci)], alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / filename, dpi=110)
        plt.close(fig)
        written.append(str(out_dir / filename))
    population = run_dir / "population" / "population.json"
    if population.is_file():
        written.append(str(payoff_heatmap(json.loads(population.read_text()), out_dir / "payoff.png")))
    evals = [r for r in rows if r.get("kind") == "eval"]
    summary = {"run_dir": str(run_dir), "steps": max((r["step"] for r in rows), default=0), "plots": written}
    if evals:
        first, last = evals[0], evals[-1]
        summary["eval"] = {
            k.split("/", 1)[1]: {
                "first": first.get(k), "first_ci95": first.get(k.replace("reward", "ci95")),
                "last": last.get(k), "last_ci95": last.get(k.replace("reward", "ci95")),
                "first_step": first["step"], "last_step": last["step"],
            }
            for k in last if k.startswith("eval_reward/")
        }
    lines = ["| role | eval reward (first step) | eval reward (last step) |", "| --- | --- | --- |"]
    for role, e in summary.get("eval", {}).items():
        lines.append(f"| {role} | {e['first']:.3f} ± {e['first_ci95']:.3f} (step {e['first_step']}) | "
                     f"{e['last']:.3f} ± {e['last_ci95']:.3f} (step {e['last_step']}) |")
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    summary["table"] = "\n".join(lines)
    return summary


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
