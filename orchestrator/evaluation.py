"""Evaluation: per role, win/draw/loss (success, for one-player games) rates with 95% Wilson
intervals and the mean reward, over a run's episodes (``rolecast eval``, and training's evaluations).

Games report ``outcome()["results"]`` (``{role: win | draw | loss}``); for other environments a
trainable role's result is the sign of its episode reward. ``--opponent`` rebinds the role the
protocol declares as the opponent (``opponent_role()`` of its config): ``random``, ``minimax`` or
any builtin policy, ``base`` (the model without an adapter) or ``checkpoint:PATH`` (a saved
PEFT adapter, loaded into the engine). Where a role bound to ``builtin:random`` cannot see the
game's legal moves (some TextArena games), eval warns and lists it under ``illegal_baseline``.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import RolecastError
from .policies.binding import Binding
from .registry import default_registry
from .role import RoleSpec
from .team import CHECKPOINT_ADAPTER, Team, opponent_problem
from .transcript import EpisodeRecord

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
    return {name: ("win" if r > 0 else "draw" if r == 0 else "loss") for name, r in record.rewards.items()
            if team.roles[name].config.policy.trainable and record.in_episode(name)}


def evaluate(team: Team, records: Sequence[EpisodeRecord], summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per role that has a result: counts, rates with Wilson intervals, mean reward."""
    counts: dict[str, Counter] = {}
    for record in (r for r in records if r.status == "ok"):  # one at a time: a run's may be read back from disk
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
    if problem := opponent_problem(opponent, team.env_config, default_registry(), team.roles):
        raise RolecastError(f"--opponent {opponent}: {team.name}: {problem}")
    role = team.env_config.opponent_role()
    if role in overrides:
        raise RolecastError(f"--opponent and --policy both bind role {role!r}")
    kind, _, target = opponent.partition(":")
    if opponent == "base":
        return dataclasses.replace(team, roles={**team.roles, role: with_adapter(team.roles[role], None)}), role, None
    if kind == "checkpoint":
        spec = with_adapter(team.roles[role], CHECKPOINT_ADAPTER)
        return dataclasses.replace(team, roles={**team.roles, role: spec}), role, Path(target)
    name = target if kind == "builtin" else opponent
    overrides[role] = Binding("builtin", name)
    return team, role, None


def blind_random_roles(team: Team, bindings: dict[str, str]) -> list[str]:
    """Roles bound to ``builtin:random`` in a game whose views list no legal moves (some TextArena
    games): it sends random words, which the game rejects, so it is no baseline there."""
    known = getattr(team.env_config, "legal_moves_known", None)
    if known is None or known():
        return []
    return [name for name, binding in bindings.items() if binding == "builtin:random"]
