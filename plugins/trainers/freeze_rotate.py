"""``freeze-rotate``: one adapter learns per phase while the others stay frozen.

Phases last ``every`` steps (default 10) and follow ``schedule`` (default: the trainable
adapters in team order), cycling: at step s the adapter schedule[(s // every) % len(schedule)]
trains. Frozen partners make each learner's environment stationary for a phase, at the cost
of slower joint progress. Advantages are GRPO's.
"""
from __future__ import annotations

from typing import Any

from orchestrator.training.trainer import TrainerContext

from .grpo import GRPO


class FreezeRotate(GRPO):
    def __init__(self, context: TrainerContext):
        super().__init__(context)
        self.every = int(context.config.get("every", 10))
        if self.every < 1:
            raise ValueError("freeze-rotate: `every` must be at least 1")
        self.schedule = list(context.config.get("schedule") or context.adapter_names)
        unknown = sorted(set(self.schedule) - set(context.adapter_names))
        if unknown or not self.schedule:
            raise ValueError(f"freeze-rotate: schedule names unknown adapter(s) {unknown}; trainable: {context.adapter_names}")

    def adapters_to_train(self, step: int) -> list[str]:
        return [self.schedule[(step // self.every) % len(self.schedule)]]

    def state_dict(self) -> dict[str, Any]:
        return {}
