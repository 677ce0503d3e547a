"""``freeze-rotate``: one adapter learns per phase while the others stay frozen.

Phases last ``every`` steps (default 10) and follow ``schedule`` (default: the trainable
adapters in team order), cycling: at step s (the first is 1) the adapter
schedule[((s - 1) // every) % len(schedule)] trains. Frozen partners make each learner's environment stationary for a phase, at the cost
of slower joint progress. Advantages are GRPO's.
"""
from __future__ import annotations

from pydantic import Field

from orchestrator.training.trainer import TrainerContext

from .grpo import GRPO


class FreezeRotate(GRPO):
    class Config(GRPO.Config):
        every: int = Field(10, ge=1, description="steps per phase")
        schedule: list[str] | None = Field(
            None, min_length=1, description="adapters in phase order, repeats allowed; default: every trainable adapter")

    config: Config

    def __init__(self, context: TrainerContext):
        super().__init__(context)
        self.schedule = list(self.config.schedule or context.adapter_names)
        unknown = sorted(set(self.schedule) - set(context.adapter_names))
        if unknown or not self.schedule:
            raise ValueError(f"freeze-rotate: schedule names unknown adapter(s) {unknown}; trainable: {context.adapter_names}")

    def adapters_to_train(self, step: int) -> list[str]:
        return [self.schedule[((step - 1) // self.config.every) % len(self.schedule)]]
