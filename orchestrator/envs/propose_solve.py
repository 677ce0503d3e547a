"""``propose_solve``: a Proposer writes an arithmetic problem, a Solver tries it several times;
the Proposer is paid for problems at the edge of the Solver's ability, the Solver for solving.

    protocol:
      type: propose_solve
      proposer: proposer
      solver: solver
      attempts: 4             # the Solver's tries at each problem, each without seeing the others
      max_operand: 999
      illegal_penalty: -1.0   # a valid message posing a problem outside the rules

The Proposer's message is ``{"a": 37, "op": "*", "b": 12}`` (op: ``+``, ``-`` or ``*``); the
environment knows the answer. The Solver's is ``{"answer": 444}``. With p the share of the
Solver's attempts that were right:

    Solver    reward p
    Proposer  reward 4 p (1 - p)     1 at p = 1/2, 0 for a problem always or never solved

so the Proposer learns to pose problems the Solver solves about half the time, and as the Solver
improves those problems get harder: the curriculum comes from the two learning together.
An invalid proposal ends the episode with the Proposer's invalid-turn penalty and no reward; a
valid one outside the rules (an operand past ``max_operand``, another op) ends it with
``illegal_penalty`` for the Proposer, so posing out of bounds never pays as well as posing a
problem the Solver always solves.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Any, ClassVar

from pydantic import Field, model_validator

from ..messages import Message
from ..yamlfile import Loc
from .base import Env, EnvConfig, StepResult, whole_number

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ProposeSolveConfig(EnvConfig):
    invalid_turns: ClassVar[str] = "an invalid problem ends the episode, an invalid answer is a wrong one"
    proposer: str = "proposer"
    solver: str = "solver"
    attempts: int = Field(4, ge=2, le=32, description="the Solver's independent tries at each problem")
    max_operand: int = Field(999, ge=1)
    illegal_penalty: float = Field(-1.0, description="the Proposer's reward for a valid problem outside the rules")

    @model_validator(mode="after")
    def _two_roles(self) -> "ProposeSolveConfig":
        if self.proposer == self.solver:
            raise ValueError("proposer and solver must be different roles")
        return self

    def turns_needed(self) -> int:
        return 1 + self.attempts  # the proposal, then every try at it

    def role_refs(self) -> list[tuple[Loc, str]]:
        return [(("proposer",), self.proposer), (("solver",), self.solver)]


class ProposeSolveEnv(Env):
    Config = ProposeSolveConfig
    observation_keys = frozenset({"problem", "max_operand", "attempt"})
    config: ProposeSolveConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.problem: dict[str, Any] | None = None
        self.answers: list[int | None] = []
        self.done = False
        self.reason = ""

    @classmethod
    def reads(cls, config: ProposeSolveConfig, role: str) -> dict[str, list[Any] | None]:
        # a proposer without them (another protocol's schema) posed an illegal problem every episode
        if role == config.proposer:
            return {"a": None, "op": None, "b": None}
        return {"answer": None} if role == config.solver else {}

    def next_role(self) -> str | None:
        if self.done:
            return None
        return self.config.proposer if self.problem is None else self.config.solver

    def observe(self, role: str) -> dict[str, Any]:
        return {"problem": self.problem, "max_operand": self.config.max_operand, "attempt": len(self.answers) + 1}

    async def step(self, role: str, message: Message) -> StepResult:
        c = self.config
        if role == c.proposer:
            if not message.valid:  # the episode loop charged its invalid-turn penalty
                self.done, self.reason = True, "no valid problem"
                return StepResult(done=True)
            if not self._well_formed(message.content or {}):
                self.done, self.reason = True, "illegal problem"
                return StepResult(rewards={c.proposer: c.illegal_penalty}, done=True)
            self.problem = message.content
            return StepResult()
        self.answers.append(whole_number(message))
        if len(self.answers) < c.attempts:
            return StepResult()
        self.done, self.reason = True, "solved" if self.solved_share() else "unsolved"
        p = self.solved_share()
        return StepResult(rewards={c.solver: p, c.proposer: 4 * p * (1 - p)}, done=True)

    def _well_formed(self, problem: dict[str, Any]) -> bool:
        if problem.get("op") not in OPS:
            return False
        values = [problem.get("a"), problem.get("b")]
        return all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= self.config.max_operand for v in values)

    def answer(self) -> int | None:
        return OPS[self.problem["op"]](self.problem["a"], self.problem["b"]) if self.problem else None

    def solved_share(self) -> float:
        right = self.answer()
        return sum(a == right for a in self.answers) / len(self.answers) if self.answers else 0.0

    def outcome(self) -> dict[str, Any]:
        return {"problem": self.problem, "answer": self.answer(), "answers": self.answers,
                "solved": self.solved_share(), "reason": self.reason}

    @classmethod
    def outcome_metrics(cls, config: EnvConfig, outcomes: list[dict[str, Any]]) -> dict[str, float]:
        """How varied the Proposer's problems were: the share of distinct ones, and the share of
        the commonest (a Proposer collapsing onto one easy problem shows here, not in its reward)."""
        posed = [json.dumps(o["problem"], sort_keys=True) for o in outcomes if o.get("problem")]
        if not posed:
            return {}
        return {"distinct_problems": len(set(posed)) / len(posed),
                "commonest_problem": Counter(posed).most_common(1)[0][1] / len(posed)}
