"""``grpo``: independent learners with group-relative advantages.

Each role learns on its own. For a group of G episodes of the same task, role i's advantage in
episode e is
    A_{e,i} = r_{e,i} - mean_e' r_{e',i}                 (scale_std: false)
    A_{e,i} = (r_{e,i} - mean_e' r_{e',i}) / std_e' r_{e',i}   (scale_std: true)
and every action token of role i in episode e gets A_{e,i}.
"""
from __future__ import annotations

from pydantic import Field

from orchestrator.config import PluginConfig
from orchestrator.training.trainer import Rewards, Trainer, centred


class GRPO(Trainer):
    class Config(PluginConfig):
        scale_std: bool = Field(False, description="divide each group's centred rewards by their std")

    config: Config

    def advantages(self, rewards: Rewards) -> Rewards:
        out: Rewards = [[{} for _ in group] for group in rewards]
        for g, group in enumerate(rewards):
            for role in self.context.adapters:
                adv = centred([episode.get(role, 0.0) for episode in group], self.config.scale_std)
                for e, value in enumerate(adv):
                    out[g][e][role] = value
        return out
