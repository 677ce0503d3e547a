"""``rolecast eval RECIPE``: play N episodes and report, per role, win/draw/loss (success, for
one-player games) rates with 95% Wilson intervals and the mean reward.

Games report ``outcome()["results"]`` (``{role: win | draw | loss}``); for other environments a
trainable role's result is the sign of its episode reward. ``--opponent`` rebinds the role the
protocol declares as the opponent (``opponent_role()`` of its config): ``random``, ``minimax`` or
any builtin policy, ``base`` (the model without an adapter) or ``checkpoint:PATH`` (a saved
PEFT adapter, loaded into the engine). Where a role bound to ``builtin:random`` cannot see the
game's legal moves (some TextArena games), eval warns and lists it under ``illegal_baseline``.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import structlog
from rich.console import Console
from rich.table import Table

from .errors import RolecastError
from .policies.binding import Binding
from .registry import default_registry
from .role import RoleSpec
from .team import Team
from .transcript import EpisodeRecord

log = structlog.get_logger()
CHECKPOINT_ADAPTER = "eval-opponent"
RESULTS = ("win", "draw", "loss")


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval of a rate (sound near 0 and 1, unlike the normal approximation)."""
    if n == 0:
        return None
    p = successes / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(max(0.0, center - half), 4), round(min(1.0, center + half), 4)


def episode_results(team: Team, record: EpisodeRecord) -> dict[str, str]:
    results = record.outcome.get("results")
    if isinstance(results, dict):
        return results
    return {name: ("win" if r > 0 else "draw" if r == 0 else "loss")
            for name, r in record.rewards.items() if team.roles[name].config.policy.trainable}


def evaluate(team: Team, records: list[EpisodeRecord], summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per role that has a result: counts, rates with Wilson intervals, mean reward."""
    finished = [r for r in records if r.status == "ok"]
    counts: dict[str, Counter] = {}
    for record in finished:
        for role, result in episode_results(team, record).items():
            counts.setdefault(role, Counter())[result] += 1
    out: dict[str, dict[str, Any]] = {}
    for role in team.roles:
        if role not in counts:
            continue
        c, n = counts[role], sum(counts[role].values())
        entry: dict[str, Any] = {"games": n, **{k: c[k] for k in RESULTS}}
        for k in RESULTS:
            entry[f"{k}_rate"] = round(c[k] / n, 4)
            entry[f"{k}_ci95"] = wilson(c[k], n)
        entry["mean_reward"] = summary["roles"][role]["mean_reward"]
        entry["reward_ci95"] = summary["roles"][role]["reward_ci95"]
        out[role] = entry
    return out


def with_adapter(spec: RoleSpec, adapter: str | None) -> RoleSpec:
    policy = spec.config.policy.model_copy(update={"adapter": adapter, "bind": None})
    return dataclasses.replace(spec, config=spec.config.model_copy(update={"policy": policy}), binding=None)


def bind_opponent(team: Team, opponent: str, overrides: dict[str, Binding]) -> tuple[Team, str, Path | None]:
    """(team with the opponent's adapter replaced if need be, opponent role, checkpoint to load)."""
    declared = getattr(team.env_config, "opponent_role", None)
    role = declared() if declared else None
    if role is None:
        raise RolecastError(f"--opponent: {team.name} declares no opponent role (protocol key `opponent:`)")
    if role in overrides:
        raise RolecastError(f"--opponent and --policy both bind role {role!r}")
    kind, _, target = opponent.partition(":")
    if opponent == "base":
        return dataclasses.replace(team, roles={**team.roles, role: with_adapter(team.roles[role], None)}), role, None
    if kind == "checkpoint":
        path = Path(target)
        if not (path / "adapter_config.json").is_file():
            raise RolecastError(f"--opponent {opponent}: not a PEFT adapter dir (no adapter_config.json)")
        spec = with_adapter(team.roles[role], CHECKPOINT_ADAPTER)
        return dataclasses.replace(team, roles={**team.roles, role: spec}), role, path
    name = target if kind == "builtin" else opponent
    if name not in default_registry().items["policies"]:
        known = ", ".join(["base", "checkpoint:PATH"] + default_registry().names("policies"))
        raise RolecastError(f"--opponent {opponent!r}: unknown (use one of {known})")
    overrides[role] = Binding("builtin", name)
    return team, role, None


def blind_random_roles(team: Team, bindings: dict[str, str]) -> list[str]:
    """Roles bound to ``builtin:random`` in a game whose views list no legal moves (some TextArena
    games): it sends random words, which the game rejects, so it is no baseline there."""
    known = getattr(team.env_config, "legal_moves_known", None)
    if known is None or known():
        return []
    return [name for name, binding in bindings.items() if binding == "builtin:random"]


def handler(args: argparse.Namespace) -> int:
    from .cli import _load_engine, _parse_adapter_flags, _parse_policy_flags
    from .runner import RunOptions, build_policies, run_team
    from .team import load_team

    team = load_team(args.recipe)
    overrides = _parse_policy_flags(args.policy)
    adapters = _parse_adapter_flags(args.adapter)
    opponent_role, checkpoint = None, None
    if args.opponent:
        team, opponent_role, checkpoint = bind_opponent(team, args.opponent, overrides)
    cfg = team.config
    model = args.model or cfg.model
    seed = cfg.seed if args.seed is None else args.seed

    def engine_factory():
        return _load_engine(model, args.dtype, seed, args.engine,
                            {**adapters, **({CHECKPOINT_ADAPTER: checkpoint} if checkpoint else {})})

    policies = build_policies(team, overrides, engine_factory)
    bindings = {name: str(overrides.get(name) or spec.binding or f"model ({spec.config.policy.adapter or 'base'})")
                for name, spec in team.roles.items()}
    blind = blind_random_roles(team, bindings)
    if blind:
        log.warning("builtin:random is no baseline here: the game lists no legal moves, so it sends random words "
                    "and loses", team=team.name, roles=blind)
    out = args.out or Path("runs") / f"eval-{team.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    options = RunOptions(episodes=args.episodes, seed=seed, out_dir=out, concurrency=args.concurrency or cfg.concurrency,
                         episode_timeout_s=cfg.episode_timeout_s, progress=not (args.no_progress or args.json),
                         extra={"eval": True, "model": model, "policy": args.policy, "opponent": args.opponent,
                                "adapter": args.adapter})

    async def go():
        try:
            return await run_team(team, policies, options)
        finally:
            for engine in {id(p.engine): p.engine for p in policies.values() if hasattr(p, "engine")}.values():
                await engine.aclose()

    result = asyncio.run(go())
    report = {"team": team.name, "episodes": len(result.episodes), "status": result.summary["status"],
              "opponent": {"role": opponent_role, "policy": args.opponent} if opponent_role else None,
              "bindings": bindings, "roles": evaluate(team, result.episodes, result.summary),
              "illegal_baseline": blind, "run_dir": str(result.run_dir)}
    (result.run_dir / "eval.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0


def print_report(report: dict[str, Any]) -> None:
    title = f"{report['team']}: {report['episodes']} episodes {report['status']}"
    if report["opponent"]:
        title += f", opponent {report['opponent']['role']} = {report['opponent']['policy']}"
    table = Table(title=title)
    for col in ("role", "policy", "W-D-L", "win rate", "95% CI", "mean reward"):
        table.add_column(col, justify="left" if col in ("role", "policy") else "right", no_wrap=True)
    for name, e in report["roles"].items():
        lo, hi = e["win_ci95"]
        reward = f"{e['mean_reward']:.3f}" + ("" if e["reward_ci95"] is None else f" ±{e['reward_ci95']:.3f}")
        table.add_row(name, report["bindings"][name], f"{e['win']}-{e['draw']}-{e['loss']}", f"{e['win_rate']:.3f}",
                      f"{lo:.3f}-{hi:.3f}", reward)
    console = Console()
    console.print(table)
    console.print(f"win rate = success rate in one-player games; run dir: {report['run_dir']}", highlight=False)
    if report["illegal_baseline"]:
        console.print(f"not a baseline: builtin:random ({', '.join(report['illegal_baseline'])}) cannot see this game's "
                      "legal moves", highlight=False)


def register_cli(subparsers: Any) -> None:
    from .cli import ADAPTER_HELP, ENGINE_HELP, ENGINES

    p = subparsers.add_parser("eval", help="win/draw/loss (or success) rates with 95%% intervals, per role")
    p.add_argument("recipe", type=Path, help="team or recipe YAML")
    p.add_argument("--episodes", type=int, default=100, help="episodes to play (default 100)")
    p.add_argument("--policy", action="append", default=[], metavar="ROLE=BINDING",
                   help="bind a role, as for `rolecast run` (repeatable)")
    p.add_argument("--opponent", metavar="OPPONENT",
                   help="rebind the recipe's opponent role: random, minimax (any builtin), base, or checkpoint:PATH")
    p.add_argument("--model", help="smollm2-135m (default), tiny, a local Hugging Face model dir, or a hub id (org/name)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--engine", default="hf", choices=ENGINES, help=ENGINE_HELP)
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH", help=ADAPTER_HELP)
    p.add_argument("--seed", type=int, help="run seed (default: the team's `seed`)")
    p.add_argument("--concurrency", type=int, help="episodes in flight at once")
    p.add_argument("--out", type=Path, help="run dir (default: runs/eval-<team>-<time>)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=handler)
