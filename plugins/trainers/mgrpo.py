"""``m-grpo``: multi-agent GRPO on team rewards.

G teams play the same task. The team reward of episode e is R_e (the mean of its roles'
rewards, or ``team_reward_role``'s reward when set); it is compared within the group:
    A_e = R_e - mean_e' R_e'   (divided by std when scale_std)
and every trainable role's tokens in episode e get A_e. With ``per_role: true`` (use it with
the ``hybrid`` reward, r_i = a*R + (1-a)*p_i), each role gets its own group-relative
advantage instead, so credit follows each role's process reward.
"""
from __future__ import annotations

from pydantic import Field

from orchestrator.config import NAME_PATTERN
from orchestrator.training.trainer import Rewards, centred

from .grpo import GRPO


class MGRPO(GRPO):
    class Config(GRPO.Config):
        per_role: bool = Field(False, description="each role's own group-relative advantage (GRPO's) instead of the team's")
        team_reward_role: str | None = Field(
            None, pattern=NAME_PATTERN, description="the role whose reward is the team's; default: the mean over roles")

    config: Config

    def team_reward(self, episode: dict[str, float]) -> float:
        if self.config.team_reward_role:
            return episode.get(self.config.team_reward_role, 0.0)
        values = [episode.get(role, 0.0) for role in self.context.adapters]
        return sum(values) / len(values) if values else 0.0

    def advantages(self, rewards: Rewards) -> Rewards:
        if self.config.per_role:
            return super().advantages(rewards)
        out: Rewards = []
        for group in rewards:
            adv = centred([self.team_reward(episode) for episode in group], self.config.scale_std)
            out.append([{role: a for role in self.context.adapters} for a in adv])
        return out
