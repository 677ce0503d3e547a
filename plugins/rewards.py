"""Built-in reward functions: ``reward(episode, roles, config) -> {role: reward}``.

``episode`` is an ``EpisodeRecord``: ``episode.rewards`` holds each role's environment reward
(invalid-turn penalties included); environments with a team outcome put it in
``episode.outcome["outcome"]`` and per-role process rewards in ``episode.outcome["process"]``.
"""
from __future__ import annotations

from typing import Any

from orchestrator.transcript import EpisodeRecord


def env_reward(episode: EpisodeRecord, roles: list[str], config: dict[str, Any]) -> dict[str, float]:
    """The environment's own per-role rewards."""
    return {role: episode.rewards.get(role, 0.0) for role in roles}


def team_outcome(episode: EpisodeRecord, roles: list[str]) -> float:
    """R: the env's team outcome when it reports one, else the mean of the roles' rewards."""
    if "outcome" in episode.outcome and episode.outcome["outcome"] is not None:
        return float(episode.outcome["outcome"])
    values = [episode.rewards.get(role, 0.0) for role in roles]
    return sum(values) / len(values) if values else 0.0


def outcome_reward(episode: EpisodeRecord, roles: list[str], config: dict[str, Any]) -> dict[str, float]:
    """One shared team reward R for every role."""
    r = team_outcome(episode, roles)
    return {role: r for role in roles}


def hybrid_reward(episode: EpisodeRecord, roles: list[str], config: dict[str, Any]) -> dict[str, float]:
    """r_i = a*R + (1-a)*p_i, with p_i the role's process reward (0 when the env gives none)."""
    a = float(config.get("alpha", 0.6))
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"hybrid reward: alpha must be in [0, 1], got {a}")
    r = team_outcome(episode, roles)
    process = episode.outcome.get("process") or {}
    return {role: a * r + (1 - a) * float(process.get(role, 0.0)) for role in roles}


def zero_sum_reward(episode: EpisodeRecord, roles: list[str], config: dict[str, Any]) -> dict[str, float]:
    """r_i = e_i - mean_j e_j over the players: what one gains the others lose."""
    players = list(config.get("players") or roles)
    values = {p: episode.rewards.get(p, 0.0) for p in players}
    mean = sum(values.values()) / len(values) if values else 0.0
    return {role: values[role] - mean if role in values else 0.0 for role in roles}


def judge_reward(episode: EpisodeRecord, roles: list[str], config: dict[str, Any]) -> dict[str, float]:
    """The judge role's verdict: the role (or stance) named in its ``field`` wins.

    config: judge (role, default "judge"), field (default "winner"), win (1.0), lose (-0.5),
    stances ({role: stance} to match stances as well as role names).
    """
    judge, field = config.get("judge", "judge"), config.get("field", "winner")
    win, lose = float(config.get("win", 1.0)), float(config.get("lose", -0.5))
    stances = {str(v).lower(): k for k, v in (config.get("stances") or {}).items()}
    verdicts = [t.content for t in episode.turns if t.role == judge and t.valid and t.content]
    if not verdicts:
        return {role: 0.0 for role in roles}
    named = str(verdicts[-1].get(field, "")).strip().lower()
    winner = named if named in roles else stances.get(named)
    if winner is None:
        return {role: 0.0 for role in roles}
    return {role: 0.0 if role == judge else (win if role == winner else lose) for role in roles}


REWARDS = {
    "env": env_reward,
    "outcome": outcome_reward,
    "hybrid": hybrid_reward,
    "zero-sum": zero_sum_reward,
    "judge": judge_reward,
}
