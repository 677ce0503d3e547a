"""``rolecast eval RECIPE --population RUN_DIR``: a round robin among a population run's members,
their snapshots and builtin baselines; writes ``population.json`` (payoff and score matrices,
ratings with 95% intervals, 3-cycles) to ``RUN_DIR/population/`` unless ``--out`` says where.
``rolecast report RUN_DIR`` then draws the payoff heatmap."""
from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path
from typing import Any

from .. import logs
from ..errors import RolecastError
from ..launch import claimed, recorded_run, run_dir
from ..files import write_atomic
from .flags import print_table, shows_progress, stdout_console


def handle(args: argparse.Namespace, team: Any) -> int:
    from ..engines.load import load_engine
    from ..population import Entrant, analyse, play_round_robin
    from ..registry import default_registry
    from ..rollout import check_grammars
    from ..team import trainable_roles
    from ..training.trainer import build_trainer

    run: Path = args.population
    if not run.is_dir():  # a file (its population.json, say) is there: "no such folder" sent the user looking for one
        raise RolecastError(f"--population {run}: {'not a folder' if run.exists() else 'no such folder'} "
                            "(a `rolecast train` run of a population recipe)")
    games_per_pair = args.games_per_pair or 20
    # a run dir (its config.yaml) is refused as plain eval's --out is: into the training run itself, its
    # games went among the run's files and `rolecast report` of it drew no heatmap (it reads population/)
    out = run_dir(args.out, "", fresh=True) if args.out else run / "population"
    if (out / "population.json").exists():
        raise RolecastError(f"{out} already holds a round robin (population.json): give another --out, or remove it first")
    mixed = [flag for flag, value in (("--opponent", args.opponent), ("--policy", args.policy), ("--adapter", args.adapter))
             if value]
    if mixed:
        raise RolecastError(f"--population plays its own entrants: drop {', '.join(mixed)}")
    training = team.config.training
    if training is None or training.trainer != "population":
        raise RolecastError(f"--population: {team.path} does not train a population (training.trainer: population)")
    registry = default_registry()
    cls = registry.get("trainers", "population")
    trainer = build_trainer(cls, trainable_roles(team.roles), trained_with(run, team))
    if len(trainer.players) != 2:
        raise RolecastError(f"--population: round robins seat two players; {team.path} has {trainer.players}")
    missing = [m for m in trainer.members if not (run / "sampler" / m / "adapter_config.json").is_file()]
    if missing:
        raise RolecastError(f"--population: {run / 'sampler'} lacks member(s) {', '.join(missing)} (is it a run of this recipe?)")
    baselines = list(dict.fromkeys(args.baseline or ["random"]))  # a baseline named twice is one entrant
    unknown = [b for b in baselines if b not in registry.items["policies"]]
    if unknown:
        raise RolecastError(f"--baseline {', '.join(unknown)}: unknown (builtin policies: {', '.join(registry.names('policies'))})")
    if taken := [b for b in baselines if b in trainer.members]:  # one entrant's name: their games were counted as one's
        raise RolecastError(f"--baseline {taken[0]}: a member of {run} has that name too, and the round robin names "
                            "entrants by name: give another --baseline")
    adapters = {m: run / "sampler" / m for m in trainer.members} | {p.name: p for p in snapshots(run, trainer.members)}
    entrants = [Entrant(name, adapter=name) for name in adapters] + [Entrant(b, builtin=b) for b in baselines]
    seed = team.config.seed if args.seed is None else args.seed
    # the model and dtype the population trained with, as its config.yaml records them, unless the flags say otherwise
    then = (recorded_run(run) or {}).get("run") or {}
    model = args.model or then.get("model") or team.config.model
    dtype = then.get("dtype", "auto") if args.dtype == "auto" and not args.model else args.dtype
    check_grammars(team, {})
    with claimed(out):  # a second round robin into it would mix its games with these
        engine = load_engine(model, dtype, seed, args.engine, adapters, args.device)

        async def go():
            try:
                return await play_round_robin(
                    team, trainer.players, entrants, engine, games_per_pair, seed=seed, out_dir=out,
                    concurrency=args.concurrency or team.config.concurrency, timeout=args.timeout, registry=registry,
                    progress=shows_progress(args))
            finally:
                await engine.aclose()

        games = asyncio.run(go())
        report = {"team": team.name, "run_dir": str(run), "model": model, "dtype": dtype,
                  **analyse(entrants, games, games_per_pair, seed)}
        write_atomic(out / "population.json", json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report, out)
    return 0


def snapshots(run: Path, members: list[str]) -> list[Path]:
    """The run's pool as its last checkpoint holds it (all of ``pool/`` without one), by step:
    only the folders the trainer names ``<member>@<step>`` (one made by hand, ``x@abc``, is none)."""
    kept = pool_at_last_checkpoint(run)  # a snapshot that left the pool keeps its folder (an older checkpoint names it)
    name = re.compile(f"(?:{'|'.join(map(re.escape, members))})@([0-9]+)")
    found = [p for p in (run / "pool").glob("*@*") if name.fullmatch(p.name) and (p / "adapter_config.json").is_file()
             and (kept is None or p.name in kept)]
    return sorted(found, key=lambda p: (int(name.fullmatch(p.name)[1]), p.name))


def pool_at_last_checkpoint(run: Path) -> set[str] | None:
    """The snapshots in the trainer's pool at the run's newest whole checkpoint; None without one."""
    from ..training.loop import last_checkpoint

    found = last_checkpoint(run, "--population")
    return None if found is None else set(found[1]["trainer"].get("pool", []))


def trained_with(run: Path, team: Any) -> dict[str, Any]:
    """The trainer_config ``run`` was trained with (its config.yaml: a ``--set
    trainer_config.members=N`` there is what made its members), else the recipe's."""
    recipe = team.config.training.trainer_config
    config = recorded_run(run)
    if config is None:
        return recipe
    recorded = config.get("recipe") or {}
    if recorded.get("name", team.name) != team.name:
        raise RolecastError(f"--population: {run} is a run of recipe {recorded['name']!r}, not {team.name!r}")
    then = (recorded.get("training") or {}).get("trainer_config")
    if not isinstance(then, dict):
        return recipe
    if then != recipe:
        logs.say(f"rolecast eval: the members of {run} as its config.yaml records them "
                 f"(training.trainer_config: {json.dumps(then)})")
    return then


def print_report(report: dict[str, Any], out: Path) -> None:
    from rich.table import Table

    names = [e["name"] for e in report["entrants"]]
    n = report["games_played"]
    table = Table(title=f"{report['team']}: {n} game{'s' * (n != 1)}, {report['games_per_pair']} a pair")
    for col in ("entrant", "Elo", "95% CI", "mean score"):
        table.add_column(col, justify="left" if col == "entrant" else "right", no_wrap=True)
    elo = {n: report["ratings"][n]["elo"] for n in names}
    for name in sorted(names, key=lambda n: (elo[n] is None, -(elo[n] or 0.0))):  # no finished game: last, "-"
        r = report["ratings"][name]
        scores = [s for s in report["score"][name].values() if s is not None]
        ci = f"{r['ci95'][0]:.0f}-{r['ci95'][1]:.0f}" if r["ci95"] else "-"
        table.add_row(name, "-" if r["elo"] is None else f"{r['elo']:.0f}", ci,
                      f"{sum(scores) / len(scores):.3f}" if scores else "-")
    console = stdout_console()
    print_table(console, table)
    nt = report["non_transitivity"]
    console.print(f"3-cycles in the win graph: {nt['cyclic_triads']} of {nt['decided_triads']} decided triads; "
                  f"written: {out / 'population.json'}", highlight=False, markup=False, soft_wrap=True)  # the path whole
