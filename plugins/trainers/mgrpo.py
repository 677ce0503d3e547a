"""``m-grpo``: multi-agent GRPO: group-relative advantages for a team of roles.

G teams play the same task; r_{e,i} is role i's reward in episode e (after the reward plugin).
``baseline`` says what each reward is compared with:

    team      A_{e,i} = R_e - mean_e' R_e'                  R_e: the team's reward (the mean of
              the roles' rewards, or ``team_reward_role``'s); every role of episode e gets it
    global    A_{e,i} = r_{e,i} - mean_{e',j} r_{e',j}      one baseline pooled over every role
              (GRPO applied to the team as if it were one agent)
    per_role  A_{e,i} = r_{e,i} - mean_e' r_{e',i}          each role against its own rewards

With ``scale_std`` each is divided by the std of the same set: for ``per_role`` that is Dr. MAS's
agent-wise normalisation (Feng et al., 2026), which keeps a role whose rewards sit in another range
from getting gradients of another scale, as a ``global`` baseline would give it.
"""
from __future__ import annotations

import statistics
from typing import Literal

from pydantic import Field, model_validator

from orchestrator.config import NAME_PATTERN
from orchestrator.training.trainer import Rewards, TrainerContext, centred

from .grpo import GRPO


class MGRPO(GRPO):
    class Config(GRPO.Config):
        baseline: Literal["team", "global", "per_role"] = Field("team", description="what a reward is compared with")
        team_reward_role: str | None = Field(
            None, pattern=NAME_PATTERN, description="the role whose reward is the team's; default: the mean over roles")

        @model_validator(mode="after")
        def _team_reward_read(self) -> "MGRPO.Config":
            if self.team_reward_role and self.baseline != "team":  # else it would be silently ignored
                raise ValueError(f"team_reward_role: only baseline team reads the team's reward, not {self.baseline}")
            return self

    config: Config

    def __init__(self, context: TrainerContext):
        super().__init__(context)
        role = self.config.team_reward_role
        if role and role not in context.adapters:  # its reward never reaches the trainer: every advantage would be 0
            raise ValueError(f"m-grpo: team_reward_role {role!r} is not a trainable role; trainable: {list(context.adapters)}")

    def team_reward(self, episode: dict[str, float]) -> float:
        if self.config.team_reward_role:
            return episode.get(self.config.team_reward_role, 0.0)
        values = [episode.get(role, 0.0) for role in self.context.adapters]
        return sum(values) / len(values) if values else 0.0

    def advantages(self, rewards: Rewards) -> Rewards:
        if self.config.baseline == "per_role":
            return super().advantages(rewards)
        roles = list(self.context.adapters)
        out: Rewards = []
        for group in rewards:
            if self.config.baseline == "team":
                adv = centred([self.team_reward(episode) for episode in group], self.config.scale_std)
                out.append([{role: a for role in roles} for a in adv])
                continue
            pooled = [episode.get(role, 0.0) for episode in group for role in roles]
            mean = sum(pooled) / len(pooled) if pooled else 0.0  # a group whose episodes all failed: none to centre
            scale = statistics.pstdev(pooled) + 1e-6 if self.config.scale_std and len(pooled) > 1 else 1.0
            out.append([{role: (episode.get(role, 0.0) - mean) / scale for role in roles} for episode in group])
        return out
