"""``generate_judge``: a Generator answers an arithmetic problem, a Judge says whether the answer
is right; the Judge is paid for agreeing with the verifiable truth.

    protocol:
      type: generate_judge
      generator: generator
      judge: judge
      max_operand: 20
      balanced_judge: false
      worker: null         # or a role that works the problem for the Judge first

The environment draws ``a op b`` (op ``+``, ``-`` or ``*``, operands 0 to ``max_operand``). The
Generator replies ``{"answer": 27}``; the Judge sees the problem and that answer and replies
``{"verdict": "correct"}`` or ``{"verdict": "incorrect"}``. Rewards: the Generator 1 for a right
answer; the Judge 1 when its verdict matches the truth. A Judge can score well by always saying
what is most often true (a Generator right 10% of the time makes "incorrect" worth 0.9), so the
outcome records the truth and the verdict for each episode. With ``balanced_judge`` the Judge
sees a right answer in half the episodes, by a fair coin per episode: the Generator's answer when
it falls on the coin's side, else the truth or a plausible wrong answer (another operation's
result, or the truth off by 1 or 10) in its place, as for no answer (an invalid turn). Then
either constant verdict earns 0.5 and only telling answers apart pays; the Generator is still paid
for its own answer.

With a ``worker`` role (give it the Judge's adapter: it is the Judge working the problem
before it sees the answer to check) the order is Generator, worker, Judge: the worker answers
the problem as the Generator does and is paid the same way, and the Judge sees its result
(``own``) beside the answer it checks, so a verdict is a comparison of two numbers.
"""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from ..messages import Message
from ..yamlfile import Loc
from .base import Env, EnvConfig, StepResult, verdict_rates, whole_number
from .propose_solve import OPS


class GenerateJudgeConfig(EnvConfig):
    invalid_turns: ClassVar[str] = "an invalid answer is no answer (a wrong one), an invalid verdict a miss"
    generator: str = "generator"
    judge: str = "judge"
    max_operand: int = Field(20, ge=1, le=10_000)
    balanced_judge: bool = False
    worker: str | None = None

    @model_validator(mode="after")
    def _different_roles(self) -> "GenerateJudgeConfig":
        names = [self.generator, self.judge] + ([self.worker] if self.worker else [])
        if len(set(names)) != len(names):
            raise ValueError(f"generator, judge and worker must be different roles, got {names}")
        return self

    def turns_needed(self) -> int:
        return 3 if self.worker else 2

    def role_refs(self) -> list[tuple[Loc, str]]:
        return [(("generator",), self.generator), (("judge",), self.judge)] + (
            [(("worker",), self.worker)] if self.worker else [])


class GenerateJudgeEnv(Env):
    Config = GenerateJudgeConfig
    observation_keys = frozenset({"problem", "answer", "own", "max_operand"})
    config: GenerateJudgeConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        n = self.config.max_operand
        self.problem = {"a": self.rng.randint(0, n), "op": self.rng.choice(sorted(OPS)), "b": self.rng.randint(0, n)}
        self.truth = OPS[self.problem["op"]](self.problem["a"], self.problem["b"])
        self.answer: int | None = None  # the Generator's
        self.own: int | None = None  # the worker's
        self.shown: int | None = None  # what the Judge judges
        self.show_right = self.rng.random() < 0.5 if self.config.balanced_judge else None
        self.verdict: str | None = None
        c = self.config
        self.order = [c.generator, *([c.worker] if c.worker else []), c.judge, None]
        self.turn = 0

    @classmethod
    def reads(cls, config: GenerateJudgeConfig, role: str) -> dict[str, list[Any] | None]:
        # a judge without it (another protocol's schema) gave no verdict, every episode
        if role == config.judge:
            return {"verdict": None}
        return {"answer": None} if role in (config.generator, config.worker) else {}

    def next_role(self) -> str | None:
        return self.order[self.turn]

    def observe(self, role: str) -> dict[str, Any]:
        judge = role == self.config.judge
        return {"problem": self.problem, "answer": self.shown if judge else None, "own": self.own if judge else None,
                "max_operand": self.config.max_operand}

    def _for_judge(self, answer: int | None) -> int | None:
        """The Generator's answer, or under ``balanced_judge`` one on the coin's side: never none
        there, which a Judge would reject on sight."""
        if self.show_right is None or (answer is not None and (answer == self.truth) == self.show_right):
            return answer
        if self.show_right:
            return self.truth
        a, b = self.problem["a"], self.problem["b"]
        wrong = {f(a, b) for f in OPS.values()} | {self.truth + d for d in (-10, -1, 1, 10)}
        return self.rng.choice(sorted(wrong - {self.truth}))

    async def step(self, role: str, message: Message) -> StepResult:
        c = self.config
        self.turn += 1
        if role == c.generator:
            self.answer = whole_number(message)
            self.shown = self._for_judge(self.answer)
            return StepResult()
        if role == c.worker:
            self.own = whole_number(message)
            return StepResult(rewards={c.worker: float(self.own == self.truth)})
        verdict = (message.content or {}).get("verdict") if message.valid else None
        self.verdict = verdict if verdict in ("correct", "incorrect") else None
        agrees = self.verdict == ("correct" if self.shown == self.truth else "incorrect")
        return StepResult(rewards={c.generator: float(self.answer == self.truth), c.judge: float(agrees)}, done=True)

    def outcome(self) -> dict[str, Any]:
        return {"problem": self.problem, "truth": self.truth, "answer": self.answer,
                "answer_correct": self.answer == self.truth, "shown": self.shown,
                "shown_correct": self.shown == self.truth, "own": self.own, "verdict": self.verdict}

    @classmethod
    def outcome_metrics(cls, config: EnvConfig, outcomes: list[dict[str, Any]]) -> dict[str, float]:
        """How often the Judge accepts the right answers it is shown and rejects the wrong ones
        (no valid verdict is a miss), and their mean."""
        accepted = {"correct": True, "incorrect": False}
        return verdict_rates("judge", [(o["shown_correct"], accepted.get(o["verdict"])) for o in outcomes])
