"""``grpo``: independent learners with group-relative advantages.

Each role learns on its own. For a group of G episodes of the same task, role i's advantage in
episode e is
    A_{e,i} = r_{e,i} - mean_e' r_{e',i}                 (scale_std: false)
    A_{e,i} = (r_{e,i} - mean_e' r_{e',i}) / std_e' r_{e',i}   (scale_std: true)
and every action token of role i in episode e gets A_{e,i}.
"""
from __future__ import annotations

from typing import Any

from orchestrator.training.trainer import Rewards, TrainerContext, centred


class GRPO:
    def __init__(self, context: TrainerContext):
        self.context = context
        self.scale_std = bool(context.config.get("scale_std", False))

    def adapters_to_train(self, step: int) -> list[str]:
        return self.context.adapter_names

    def advantages(self, rewards: Rewards) -> Rewards:
        out: Rewards = [[{} for _ in group] for group in rewards]
        for g, group in enumerate(rewards):
            for role in self.context.adapters:
                adv = centred([episode.get(role, 0.0) for episode in group], self.scale_std)
                for e, value in enumerate(adv):
                    out[g][e][role] = value
        return out

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
