"""``generate_judge``: a Generator answers an arithmetic problem, a Judge says whether the answer
is right; the Judge is paid for agreeing with the verifiable truth.

    protocol:
      type: generate_judge
      generator: generator
      judge: judge
      max_operand: 20

The environment draws ``a op b`` (op ``+``, ``-`` or ``*``, operands 0 to ``max_operand``). The
Generator replies ``{"answer": 27}``; the Judge sees the problem and that answer and replies
``{"verdict": "correct"}`` or ``{"verdict": "incorrect"}``. Rewards: the Generator 1 for a right
answer; the Judge 1 when its verdict matches the truth. A Judge can score well by always saying
what is most often true, so the outcome records the truth and the verdict for each episode:
evaluations can report its accuracy on right and on wrong answers apart.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from ..messages import Message
from ..yamlfile import Loc
from .base import Env, EnvConfig, StepResult, whole_number
from .propose_solve import OPS


class GenerateJudgeConfig(EnvConfig):
    generator: str = "generator"
    judge: str = "judge"
    max_operand: int = Field(20, ge=1, le=10_000)

    @model_validator(mode="after")
    def _two_roles(self) -> "GenerateJudgeConfig":
        if self.generator == self.judge:
            raise ValueError("generator and judge must be different roles")
        return self

    def role_refs(self) -> list[tuple[Loc, str]]:
        return [(("generator",), self.generator), (("judge",), self.judge)]


class GenerateJudgeEnv(Env):
    Config = GenerateJudgeConfig
    observation_keys = frozenset({"problem", "answer", "max_operand"})
    config: GenerateJudgeConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        n = self.config.max_operand
        self.problem = {"a": self.rng.randint(0, n), "op": self.rng.choice(sorted(OPS)), "b": self.rng.randint(0, n)}
        self.truth = OPS[self.problem["op"]](self.problem["a"], self.problem["b"])
        self.answer: int | None = None
        self.verdict: str | None = None
        self.turn = 0

    def next_role(self) -> str | None:
        return (self.config.generator, self.config.judge, None)[self.turn]

    def observe(self, role: str) -> dict[str, Any]:
        shown = self.answer if role == self.config.judge else None
        return {"problem": self.problem, "answer": shown, "max_operand": self.config.max_operand}

    async def step(self, role: str, message: Message) -> StepResult:
        c = self.config
        self.turn += 1
        if role == c.generator:
            self.answer = whole_number(message)
            return StepResult()
        verdict = (message.content or {}).get("verdict") if message.valid else None
        self.verdict = verdict if verdict in ("correct", "incorrect") else None
        right = self.answer == self.truth
        agrees = self.verdict == ("correct" if right else "incorrect")
        return StepResult(rewards={c.generator: float(right), c.judge: float(agrees)}, done=True)

    def outcome(self) -> dict[str, Any]:
        return {"problem": self.problem, "truth": self.truth, "answer": self.answer,
                "answer_correct": self.answer == self.truth, "verdict": self.verdict}
