"""What a trainer plugin is: an algorithm that turns grouped episodes into per-role advantages
and decides which adapters learn at each step.

A *group* is the episodes that share one task (GRPO's group): their rewards are compared with
each other. ``rewards[g][e][role]`` is the reward of ``role`` in episode ``e`` of group ``g``
(after the reward plugin); a trainer returns advantages of the same shape.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

Rewards = list[list[dict[str, float]]]


@dataclass
class TrainerContext:
    """What every trainer is told about the team: role -> adapter for the trainable roles."""

    adapters: dict[str, str]  # trainable role -> adapter name (several roles may share one)
    config: dict[str, Any] = field(default_factory=dict)  # the recipe's trainer_config

    @property
    def adapter_names(self) -> list[str]:
        return list(dict.fromkeys(self.adapters.values()))


class Trainer(Protocol):
    def __init__(self, context: TrainerContext): ...

    def adapters_to_train(self, step: int) -> list[str]: ...

    def advantages(self, rewards: Rewards) -> Rewards: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def centred(values: list[float], scale_std: bool, eps: float = 1e-6) -> list[float]:
    """x - mean(x), divided by std(x) when asked (a group of identical rewards gives zeros)."""
    if not values:
        return []
    mean = sum(values) / len(values)
    out = [v - mean for v in values]
    if scale_std and len(values) > 1:
        std = statistics.pstdev(values)
        out = [v / (std + eps) for v in out]
    return out
