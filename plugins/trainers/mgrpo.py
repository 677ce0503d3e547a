"""``m-grpo``: multi-agent GRPO on team rewards.

G teams play the same task. The team reward of episode e is R_e (the mean of its roles'
rewards, or ``team_reward_role``'s reward when set); it is compared within the group:
    A_e = R_e - mean_e' R_e'   (divided by std when scale_std)
and every trainable role's tokens in episode e get A_e. With ``per_role: true`` (use it with
the ``hybrid`` reward, r_i = a*R + (1-a)*p_i), each role gets its own group-relative
advantage instead, so credit follows each role's process reward.
"""
from __future__ import annotations

from orchestrator.training.trainer import Rewards, TrainerContext, centred

from .grpo import GRPO


class MGRPO(GRPO):
    def __init__(self, context: TrainerContext):
        super().__init__(context)
        self.per_role = bool(context.config.get("per_role", False))
        self.team_role = context.config.get("team_reward_role")

    def team_reward(self, episode: dict[str, float]) -> float:
        if self.team_role:
            return episode.get(self.team_role, 0.0)
        values = [episode.get(role, 0.0) for role in self.context.adapters]
        return sum(values) / len(values) if values else 0.0

    def advantages(self, rewards: Rewards) -> Rewards:
        if self.per_role:
            return super().advantages(rewards)
        out: Rewards = []
        for group in rewards:
            adv = centred([self.team_reward(episode) for episode in group], self.scale_std)
            out.append([{role: a for role in self.context.adapters} for a in adv])
        return out
