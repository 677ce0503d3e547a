"""Built-in reward functions: ``reward(episode, roles, config) -> {role: reward}``.

``episode`` is an ``EpisodeRecord``: ``episode.rewards`` holds each role's environment reward
(invalid-turn penalties included); environments with a team outcome put it in
``episode.outcome["outcome"]`` and per-role process rewards in ``episode.outcome["process"]``.
A reward gives each role its own invalid-turn penalties in full and keeps them out of any team
figure (the env's outcome, a judge's verdict, the roles' mean), so a role's ``invalid_penalty``
counts whatever the reward, for that role alone.

A reward's options are its ``Config`` attribute, a ``PluginConfig`` model: the recipe's
``reward_config`` is checked against it when the recipe loads, and the reward is called with the
validated instance. A reward without a ``Config`` takes no options.
"""
from __future__ import annotations

from pydantic import Field

from orchestrator.config import NAME_PATTERN, PluginConfig
from orchestrator.transcript import EpisodeRecord


def env_reward(episode: EpisodeRecord, roles: list[str], config: PluginConfig) -> dict[str, float]:
    """The environment's own per-role rewards."""
    return {role: episode.rewards.get(role, 0.0) for role in roles}


def penalties(episode: EpisodeRecord, role: str) -> float:
    """The invalid-turn penalties ``role`` took in ``episode`` (each turn still invalid after its retries)."""
    return sum(t.penalty for t in episode.turns if t.role == role)


def team_outcome(episode: EpisodeRecord, roles: list[str]) -> tuple[float, dict[str, float]]:
    """R: the env's team outcome when it reports one, else the mean over the roles that took part of
    their rewards less their invalid-turn penalties; and what each role adds to R: its own penalties.
    Kept out of R, a misformed turn costs its own role in full (under ``hybrid``, whatever alpha)
    and never a teammate."""
    own = {role: penalties(episode, role) for role in roles}
    if "outcome" in episode.outcome and episode.outcome["outcome"] is not None:
        return float(episode.outcome["outcome"]), own
    # a role that sat the episode out (the other domain's teacher) holds a 0 that is no result
    values = [episode.rewards.get(role, 0.0) - own[role] for role in roles if episode.in_episode(role)]
    return (sum(values) / len(values) if values else 0.0), own


def outcome_reward(episode: EpisodeRecord, roles: list[str], config: PluginConfig) -> dict[str, float]:
    """One shared team reward R for every role (less a role's own invalid-turn penalties)."""
    r, own = team_outcome(episode, roles)
    return {role: r + own[role] for role in roles}


class HybridConfig(PluginConfig):
    alpha: float = Field(0.6, ge=0.0, le=1.0, description="a: the team outcome's weight against the process reward")


def hybrid_reward(episode: EpisodeRecord, roles: list[str], config: HybridConfig) -> dict[str, float]:
    """r_i = a*R + (1-a)*p_i, with p_i the role's process reward (0 when the env gives none)."""
    a = config.alpha
    r, own = team_outcome(episode, roles)
    process = episode.outcome.get("process") or {}
    return {role: a * r + (1 - a) * float(process.get(role, 0.0)) + own[role] for role in roles}


hybrid_reward.Config = HybridConfig


def unknown_roles(option: str, named: list[str], roles: list[str]) -> None:
    if missing := [n for n in named if n not in roles]:
        raise ValueError(f"{option}: {', '.join(map(repr, missing))} not a role of the team ({', '.join(roles)})")


class ZeroSumConfig(PluginConfig):
    players: list[str] | None = Field(None, min_length=1, description="the roles in the game; default: every role")

    def check_roles(self, roles: list[str]) -> None:
        unknown_roles("players", self.players or [], roles)


def zero_sum_reward(episode: EpisodeRecord, roles: list[str], config: ZeroSumConfig) -> dict[str, float]:
    """r_i = e_i - mean_j e_j over the players that took part, e less its invalid-turn penalties:
    what one gains the others lose; then each role's own penalties (all a role outside the game, or
    a player that sat the episode out, gets)."""
    own = {role: penalties(episode, role) for role in roles}
    players = [p for p in config.players or roles if episode.in_episode(p)]
    values = {p: episode.rewards.get(p, 0.0) - penalties(episode, p) for p in players}
    mean = sum(values.values()) / len(values) if values else 0.0
    return {role: (values[role] - mean if role in values else 0.0) + own[role] for role in roles}


zero_sum_reward.Config = ZeroSumConfig


class JudgeConfig(PluginConfig):
    judge: str = Field("judge", pattern=NAME_PATTERN, description="the role whose last valid verdict decides")
    field: str = Field("winner", description="the verdict's key that names the winner")
    win: float = Field(1.0, description="the winner's reward")
    lose: float = Field(-0.5, description="every other role's reward (the judge gets 0)")
    stances: dict[str, str] = Field(default_factory=dict, description="{role: stance}: a verdict may name a stance")

    def check_roles(self, roles: list[str]) -> None:
        unknown_roles("judge", [self.judge], roles)
        unknown_roles("stances", list(self.stances), roles)
        seen = [s.lower() for s in self.stances.values()]  # as a verdict is read
        if shared := sorted({s for s in seen if seen.count(s) > 1}):
            raise ValueError(f"stances: {', '.join(map(repr, shared))} is more than one role's: a verdict naming "
                             "it would crown one of them and count the other a loser")

    def reads(self, role: str) -> dict[str, list[str] | None]:
        return {self.field: None} if role == self.judge else {}


def judge_reward(episode: EpisodeRecord, roles: list[str], config: JudgeConfig) -> dict[str, float]:
    """The judge role's verdict: the role (or stance, or the label the env showed the judge for a
    role: ``episode.outcome["labels"]``, debate's per-episode A/B) named in its ``field`` wins."""
    judge = config.judge
    labels = {str(k).lower(): v for k, v in (episode.outcome.get("labels") or {}).items()}
    # the labels first, as the env reads them (debaters named a and b), then a role's own name, then a stance
    names = {**{v.lower(): k for k, v in config.stances.items()}, **{r.lower(): r for r in roles}, **labels}
    verdicts = [t.content for t in episode.turns if t.role == judge and t.valid and t.content]
    named = str(verdicts[-1].get(config.field, "")).strip().lower() if verdicts else ""
    winner = names.get(named)  # the verdict is compared lowercased: so are the names (a role may be `Alice`)
    if winner is None:
        return {role: penalties(episode, role) for role in roles}
    return {role: penalties(episode, role) + (0.0 if role == judge else config.win if role == winner else config.lose)
            for role in roles}


judge_reward.Config = JudgeConfig


REWARDS = {
    "env": env_reward,
    "outcome": outcome_reward,
    "hybrid": hybrid_reward,
    "zero-sum": zero_sum_reward,
    "judge": judge_reward,
}
