"""``pipeline``: roles act in order; a verdict that asks for changes loops back, up to a limit.

    protocol:
      type: pipeline
      order: [planner, coder, reviewer]
      loop_back: {from: reviewer, to: coder, field: verdict, values: [request_changes]}
      max_rounds: 3
      success: {role: reviewer, field: verdict, values: [approve]}   # optional team reward
"""
from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from ..messages import Message
from ..yamlfile import Loc
from .base import Env, EnvConfig, Options, StepResult


class FieldMatch(Options):
    field: str
    values: list[Any] = Field(min_length=1)

    def matches(self, content: dict[str, Any] | None) -> bool:
        return content is not None and content.get(self.field) in self.values


class LoopBack(FieldMatch):
    from_: str = Field(alias="from")
    to: str


class Success(FieldMatch):
    role: str
    reward: float = 1.0
    failure_reward: float = 0.0


class PipelineConfig(EnvConfig):
    order: list[str] = Field(min_length=1)
    loop_back: LoopBack | None = None
    max_rounds: int = Field(3, ge=1, description="passes through the loop, the first included")
    success: Success | None = None

    @model_validator(mode="after")
    def _loop_goes_back(self) -> "PipelineConfig":
        lb = self.loop_back
        # A role outside order never acts: the loop would never fire or jump to no position, and
        # success would never be met.
        named = ([("loop_back.from", lb.from_), ("loop_back.to", lb.to)] if lb else []) + (
            [("success.role", self.success.role)] if self.success else [])
        for key, name in named:
            if name not in self.order:
                raise ValueError(f"{key} ({name!r}) is not in order {self.order}")
            # a loop jumps to one position and fires at one: not at a role's second
            if key.startswith("loop_back") and self.order.count(name) > 1:
                raise ValueError(f"{key} ({name!r}) appears {self.order.count(name)} times in order {self.order}: "
                                 "a loop needs a role that acts once per round")
        if lb and self.order.index(lb.to) > self.order.index(lb.from_):
            raise ValueError(f"loop_back.to ({lb.to}) must come before loop_back.from ({lb.from_}) in order")
        return self

    def turns_needed(self) -> int:
        lb = self.loop_back  # each round after the first goes again from its `to` to its `from`
        loop = self.order.index(lb.from_) - self.order.index(lb.to) + 1 if lb else 0
        return len(self.order) + (self.max_rounds - 1) * loop

    def role_refs(self) -> list[tuple[Loc, str]]:
        refs: list[tuple[Loc, str]] = [(("order", i), name) for i, name in enumerate(self.order)]
        if self.loop_back:
            refs += [(("loop_back", "from"), self.loop_back.from_), (("loop_back", "to"), self.loop_back.to)]
        if self.success:
            refs.append((("success", "role"), self.success.role))
        return refs


class PipelineEnv(Env):
    Config = PipelineConfig
    observation_keys = frozenset({"history", "round", "last"})
    config: PipelineConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.position = 0
        self.round = 1
        self.history: list[dict[str, Any]] = []
        self.done = False
        self.succeeded: bool | None = None

    @classmethod
    def reads(cls, config: PipelineConfig, role: str) -> dict[str, list[Any] | None]:
        out: dict[str, list[Any] | None] = {}
        for m in (config.loop_back, config.success):
            if m and role == (m.from_ if m is config.loop_back else m.role):
                out[m.field] = [*(out.get(m.field) or []), *m.values]
        return out

    def next_role(self) -> str | None:
        return None if self.done else self.config.order[self.position]

    def observe(self, role: str) -> dict[str, Any]:
        return {"history": self.history, "round": self.round, "last": self.history[-1] if self.history else None}

    def recipients(self, sender: str) -> list[str]:
        order = self.config.order  # by position: a role may act twice in order
        return [order[(self.position + 1) % len(order)]]

    async def step(self, role: str, message: Message) -> StepResult:
        self.history.append({"role": role, "content": message.content, "valid": message.valid, "turn": message.turn})
        if not message.valid and self.config.on_invalid == "end":
            return self._finish()
        lb = self.config.loop_back
        if lb and role == lb.from_ and lb.matches(message.content) and self.round < self.config.max_rounds:
            self.round += 1
            self.position = self.config.order.index(lb.to)
            return StepResult()
        self.position += 1
        if self.position >= len(self.config.order):
            return self._finish()
        return StepResult()

    def _finish(self) -> StepResult:
        self.done = True
        success = self.config.success
        if success is None:
            return StepResult(done=True)
        last = next((h for h in reversed(self.history) if h["role"] == success.role), None)
        self.succeeded = bool(last and success.matches(last["content"]))
        reward = success.reward if self.succeeded else success.failure_reward
        return StepResult(rewards={name: reward for name in self.roles}, done=True)

    def outcome(self) -> dict[str, Any]:
        return {"rounds": self.round, "succeeded": self.succeeded}
