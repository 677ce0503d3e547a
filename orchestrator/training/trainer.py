"""What a trainer plugin is: an algorithm that turns grouped episodes into per-role advantages
and decides which adapters learn at each step.

A *group* is the episodes that share one task (GRPO's group): their rewards are compared with
each other. ``rewards[g][e][role]`` is the reward of ``role`` in episode ``e`` of group ``g``
(after the reward plugin); a trainer returns advantages of the same shape.

A trainer subclasses ``Trainer``, writes ``advantages`` and overrides the other hooks it needs;
its options are a ``Config`` model (the recipe's ``trainer_config``, checked when the recipe
loads) that it reads as ``self.config``.
"""
from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..config import PluginConfig

if TYPE_CHECKING:
    from ..transcript import EpisodeRecord

Rewards = list[list[dict[str, float]]]
Snapshot = Callable[[str, str], None]  # snapshot(adapter, name)


@dataclass
class TrainerContext:
    """What every trainer is told: role -> adapter for the trainable roles, and its options."""

    adapters: dict[str, str]  # trainable role -> adapter name (several roles may share one)
    config: PluginConfig | None = None  # the trainer's Config from trainer_config; None = its defaults
    episodes_per_step: int = 0  # a step's rollout, group_size x groups_per_step (0: not known)

    @property
    def adapter_names(self) -> list[str]:
        return list(dict.fromkeys(self.adapters.values()))


class Trainer(ABC):
    """The hooks the training loop calls, in the order it calls them each step."""

    Config: ClassVar[type[PluginConfig]] = PluginConfig  # no options unless a subclass declares some

    def __init__(self, context: TrainerContext):
        self.context = context
        self.config = context.config if context.config is not None else self.Config()

    def learners(self) -> list[str]:
        """The adapters that learn, one training client and sampler dir each: by default the
        trainable roles' adapters (a population returns its members instead)."""
        return self.context.adapter_names

    def init_noise(self, adapter: str) -> float:
        """Std of the noise added to a learner's LoRA B before the first step (0: it starts as
        the base model)."""
        return 0.0

    def adapters_for(self, step: int, index: int) -> dict[str, str]:
        """role -> adapter overrides for episode ``index`` of the step's rollout (a past snapshot
        as the opponent, a population's members), each a learner or a snapshot the run holds
        (another name stops the step). A role's tokens train the adapter that played it, if that
        adapter is one of ``learners``; a snapshot's train nothing."""
        return {}

    def eval_adapters_for(self, index: int) -> dict[str, str]:
        """role -> adapter overrides for evaluation episode ``index`` (roles the evaluation
        opponent binds are left alone): needed when the recipe's adapter is not a learner."""
        return {}

    @abstractmethod
    def advantages(self, rewards: Rewards) -> Rewards:
        """Per-role advantages for every episode, in the shape of ``rewards``."""

    def step_advantages(self, rewards: Rewards, finished: list[list[bool]]) -> Rewards:
        """What the loop calls: advantages in which an episode that failed (``finished`` False: an
        error or a timeout, whose rewards are placeholders) is in no baseline and gets none. By
        default ``advantages`` over each group's finished episodes; a trainer that places episodes
        by their position in the step (a population's seats) overrides this instead."""
        kept = [[rw for rw, ok in zip(group, oks) if ok] for group, oks in zip(rewards, finished)]
        advantages = self.advantages(kept)
        if any(isinstance(g, Mapping) for g in advantages):  # one list of all episodes: its rows' sizes read as groups
            raise ValueError("gave a {role: advantage} mapping where a group's list of them goes: the shape is "
                             "[[{role: advantage} per episode] per group], as the rewards it was given")
        # matched to the episodes by position: one missing was a bare StopIteration, one extra was dropped unsaid
        if (shape := [len(g) for g in advantages]) != (wanted := [len(g) for g in kept]):
            raise ValueError(f"gave {shape} episodes per group for the {wanted} finished ones it was given")
        out: Rewards = []
        for group, oks, given in zip(rewards, finished, advantages):
            it = iter(given)
            out.append([next(it) if ok else {role: 0.0 for role in rw} for rw, ok in zip(group, oks)])
        return out

    def adapters_to_train(self, step: int) -> list[str]:
        """The adapters that take an optimizer step at ``step``: by default every learner."""
        return self.learners()

    def after_step(
        self, step: int, episodes: list[EpisodeRecord], rewards: list[dict[str, float]], snapshot: Snapshot
    ) -> dict[str, float]:
        """Called after the step's updates with its finished episodes (a failed one is no result)
        and their rewards, flat in rollout order;
        ``snapshot(adapter, name)`` freezes an adapter's live weights as adapter ``name``.
        Returns extra metrics for the step's row."""
        return {}

    def opponent_adapters(self) -> list[str]:
        """The snapshots (made with ``snapshot``) still played: ``--resume`` loads them back into the
        engine, and one that leaves this list is unloaded (once no rollout may seat it)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """The trainer's state for a checkpoint (JSON-serialisable)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned, on ``--resume``."""


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


def build_trainer(cls: type[Trainer], adapters: dict[str, str], options: dict[str, Any], episodes_per_step: int = 0) -> Trainer:
    """``cls`` for the trainable roles ``adapters`` (role -> adapter) with a recipe's
    ``trainer_config``; a ValueError when the options do not fit the team (self-play's players
    on two adapters, a schedule naming an unknown adapter)."""
    return cls(TrainerContext(adapters, cls.Config.model_validate(options), episodes_per_step))
