"""``debate``: two debaters argue opposite stances for N rounds, then a judge picks the winner.

    protocol:
      type: debate
      debaters: [pro, con]
      judge: judge
      rounds: 2
      rewards: {winner: 1.0, loser: -0.5, tie: 0.0}
      first: random          # who opens each episode (or: fixed, the first of debaters)

The judge sees the sides labelled A, B in a per-episode random order; its ``winner`` field may
name a side's label, its debater role or its ``params.stance``.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictStr, field_validator, model_validator

from ..messages import Message
from ..yamlfile import Loc
from .base import Env, EnvConfig, Options, StepResult, TaskConfig


class DebateRewards(Options):
    winner: float = 1.0
    loser: float = -0.5
    tie: float = 0.0


class DebateConfig(EnvConfig):
    debaters: list[str] = Field(min_length=2, max_length=2)
    judge: str
    rounds: int = Field(2, ge=1, le=20)
    rewards: DebateRewards = Field(default_factory=DebateRewards)
    winner_field: str = "winner"
    # Small judges favour the side that spoke first; a fixed order would hand one debater every
    # win, and a group of equal rewards gives GRPO nothing to learn from.
    first: Literal["random", "fixed"] = "random"

    @model_validator(mode="after")
    def _distinct(self) -> "DebateConfig":
        if len({*self.debaters, self.judge}) != 3:
            raise ValueError("the two debaters and the judge must be three different roles")
        return self

    def turns_needed(self) -> int:
        return 2 * self.rounds + 1  # an argument each a round, then the verdict

    def role_refs(self) -> list[tuple[Loc, str]]:
        return [(("debaters", i), name) for i, name in enumerate(self.debaters)] + [(("judge",), self.judge)]


class DebateTask(TaskConfig):
    topic: StrictStr  # the motion the debaters argue

    @field_validator("topic")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():  # the debaters' and judge's prompts would read "Debate topic: " and nothing
            raise ValueError("the topic is empty: give the motion the debaters argue")
        return value


class DebateEnv(Env):
    Config = DebateConfig
    Task = DebateTask
    observation_keys = frozenset({"topic", "arguments", "round", "rounds", "stance", "debaters"})
    config: DebateConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.turn = 0
        self.arguments: list[dict[str, Any]] = []
        self.winner: str | None = None
        self.done = False
        # The judge sees the sides in a per-episode random order: small judges pick whichever
        # side their prompt names first (position bias), which would make the reward constant.
        self.judge_order = list(self.config.debaters)
        self.rng.shuffle(self.judge_order)
        self.speakers = list(self.config.debaters)
        if self.config.first == "random":
            self.rng.shuffle(self.speakers)

    @classmethod
    def task_from_cli(cls, value: str) -> dict[str, Any]:
        return {"topic": value}

    @classmethod
    def reads(cls, config: DebateConfig, role: str) -> dict[str, list[Any] | None]:
        return {config.winner_field: None} if role == config.judge else {}

    def _stance(self, role: str) -> str:
        return str(self.roles[role].config.params.get("stance", role))

    def next_role(self) -> str | None:
        if self.done:
            return None
        if self.turn < 2 * self.config.rounds:
            return self.speakers[self.turn % 2]
        return self.config.judge

    def observe(self, role: str) -> dict[str, Any]:
        judging = role == self.config.judge
        labels = {d: self._label(d) for d in self.config.debaters} if judging else {}
        return {
            "topic": self.task["topic"],
            "arguments": [{**a, "label": labels.get(a["role"])} for a in self.arguments],
            "round": min(self.turn // 2 + 1, self.config.rounds),
            "rounds": self.config.rounds,
            "stance": self._stance(role) if role in self.config.debaters else None,
            "debaters": [{"role": d, "stance": self._stance(d), "label": labels.get(d)}
                         for d in (self.judge_order if judging else self.config.debaters)],
        }

    def _label(self, debater: str) -> str:
        """The judge knows the sides as A, B, ... in its per-episode order, not by stance: a small
        judge that favours a stance's word ("for") would otherwise give one side every win."""
        return chr(ord("A") + self.judge_order.index(debater))

    async def step(self, role: str, message: Message) -> StepResult:
        if role != self.config.judge:
            self.turn += 1
            if message.valid:
                self.arguments.append({"role": role, "stance": self._stance(role), **(message.content or {})})
            elif self.config.on_invalid == "end":
                self.done = True
                return StepResult(done=True)
            return StepResult()
        self.done = True
        self.winner = self._match(message.content.get(self.config.winner_field)) if message.valid and message.content else None
        r = self.config.rewards
        if self.winner is None:
            return StepResult(rewards={d: r.tie for d in self.config.debaters}, done=True)
        return StepResult(rewards={d: (r.winner if d == self.winner else r.loser) for d in self.config.debaters}, done=True)

    def _match(self, value: Any) -> str | None:
        wanted = str(value).strip().lower()
        # Labels first: they are what the judge's prompt calls the sides, and a debater may be
        # named or stand for another side's letter (debaters [a, b]).
        by_label = {self._label(d).lower(): d for d in self.config.debaters}
        if wanted in by_label:
            return by_label[wanted]
        for d in self.config.debaters:
            if wanted in (d.lower(), self._stance(d).lower()):
                return d
        return None

    def outcome(self) -> dict[str, Any]:
        # labels: what the judge called each side, for the `judge` reward, which reads the verdict
        return {"winner": self.winner, "first": self.speakers[0],
                "labels": {self._label(d): d for d in self.config.debaters}}
