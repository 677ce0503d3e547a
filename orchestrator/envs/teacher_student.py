"""``teacher_student``: a domain's teacher writes a worked example, a student answers a similar
problem with it; the teacher is paid for the improvement its example made.

    protocol:
      type: teacher_student
      student: student               # answers with the teacher's example in its prompt (trains)
      student_alone: student_alone   # the same adapter, no example: the baseline (trainable: false)
      domains:                       # each domain's problems go to its own teacher role
        largest: teacher_largest
        smallest: teacher_smallest

A task names its domain (``{domain: sequences}``; a task without one draws a domain). The episode
draws two problems of the same shape from the domain's generator: the teacher works the first
(``{"example": "..."}``), the student answers the second with that example in its prompt, and the
student alone answers the second with no example (``{"answer": 3000}``). With c = 1 when an
answer is right:

    student        c(with the example)
    teacher        c(with the example) - c(without one)      in [-1, 1]
    student_alone  c(without)                                  (reported; it should not train)

Only the student sees the example. Domains: ``largest`` and ``smallest`` (of three numbers),
``addition`` (one-digit a + b), ``sequences`` (the next term of an arithmetic sequence, one step
size per episode) and ``units`` (conversions: km to m, hours to minutes, ...). With SmolLM2-135M
only the first two move with an example (docs/populations.md), so the recipe uses those.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field, StrictStr, ValidationInfo, field_validator, model_validator

from ..messages import Message
from ..yamlfile import Loc
from .base import Env, EnvConfig, StepResult, TaskConfig, task_protocol, whole_number

Problem = dict[str, Any]  # {"text": ..., "answer": int}


def addition(rng: random.Random) -> Callable[[random.Random], Problem]:
    """a + b with one-digit a and b (SmolLM2-135M at temperature 1 got 0 of 12 sums up to 50 + 50)."""
    def draw(r: random.Random) -> Problem:
        a, b = r.randint(1, 9), r.randint(1, 9)
        return {"text": f"{a} + {b}", "answer": a + b}
    return draw


def sequences(rng: random.Random) -> Callable[[random.Random], Problem]:
    """The next term of an arithmetic sequence; one step size per episode."""
    step = rng.randint(1, 3)

    def draw(r: random.Random) -> Problem:
        start = r.randint(1, 12)
        terms = [start + k * step for k in range(4)]
        return {"text": "What comes next: " + ", ".join(map(str, terms)) + ", ?", "answer": start + 4 * step}
    return draw


def extreme(word: str, choose: Callable[[list[int]], int]) -> Callable[[random.Random], Callable[[random.Random], Problem]]:
    """The ``word`` (largest, smallest) of three different numbers below 60, picked by ``choose``."""
    def generator(rng: random.Random) -> Callable[[random.Random], Problem]:
        def draw(r: random.Random) -> Problem:
            numbers = r.sample(range(1, 60), 3)
            return {"text": f"Which is the {word}: " + ", ".join(map(str, numbers)) + "?", "answer": choose(numbers)}
        return draw
    return generator


UNITS = [("km", "m", 1000), ("m", "cm", 100), ("kg", "g", 1000), ("hours", "minutes", 60),
         ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7), ("dollars", "cents", 100)]


def units(rng: random.Random) -> Callable[[random.Random], Problem]:
    """One unit pair per episode (so the example shows the factor the student needs)."""
    big, small, factor = rng.choice(UNITS)

    def draw(r: random.Random) -> Problem:
        n = r.randint(2, 12)
        return {"text": f"How many {small} are in {n} {big}?", "answer": n * factor}
    return draw


# domain -> a function of the episode's generator that fixes the problems' shape (a sequence's
# step, a unit pair) and returns the problem generator.
GENERATORS: dict[str, Callable[[random.Random], Callable[[random.Random], Problem]]] = {
    "addition": addition, "sequences": sequences, "units": units, "largest": extreme("largest", max),
    "smallest": extreme("smallest", min),
}


class TeacherStudentConfig(EnvConfig):
    invalid_turns: ClassVar[str] = "an invalid example is no example, an invalid answer a wrong one"
    student: str = "student"
    student_alone: str = "student_alone"
    domains: dict[str, str] = Field(
        ..., min_length=1, description=f"domain -> its teacher role; domains: {', '.join(GENERATORS)}")

    @field_validator("domains")
    @classmethod
    def _known(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(GENERATORS))
        if unknown:
            raise ValueError(f"unknown domain(s) {', '.join(unknown)} (known: {', '.join(GENERATORS)})")
        return value

    @model_validator(mode="after")
    def _distinct(self) -> "TeacherStudentConfig":
        if self.student == self.student_alone or {self.student, self.student_alone} & set(self.domains.values()):
            raise ValueError("student, student_alone and the teachers must be different roles")
        return self

    def role_refs(self) -> list[tuple[Loc, str]]:
        return [(("student",), self.student), (("student_alone",), self.student_alone)] + [
            (("domains", d), role) for d, role in self.domains.items()]


class TeacherStudentTask(TaskConfig):
    domain: StrictStr | None = None  # none: drawn from the episode's seeded RNG

    @field_validator("domain")
    @classmethod
    def _has_teacher(cls, value: str | None, info: ValidationInfo) -> str | None:
        c = task_protocol(info)
        if value is not None and c is not None and value not in c.domains:
            raise ValueError(f"domain {value!r} has no teacher (protocol domains: {', '.join(c.domains)})")
        return value


class TeacherStudentEnv(Env):
    Config = TeacherStudentConfig
    Task = TeacherStudentTask
    observation_keys = frozenset({"problem", "example", "domain"})
    config: TeacherStudentConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        domains = self.config.domains
        self.domain = self.task.get("domain") or self.rng.choice(sorted(domains))
        draw = GENERATORS[self.domain](self.rng)
        self.worked, self.problem = draw(self.rng), draw(self.rng)
        while self.problem == self.worked:  # similar, not the same
            self.problem = draw(self.rng)
        self.teacher = domains[self.domain]
        self.example: str | None = None
        self.order = [self.teacher, self.config.student, self.config.student_alone]
        self.turn = 0
        self.answers: dict[str, int | None] = {}

    @classmethod
    def task_from_cli(cls, value: str) -> dict[str, Any]:
        return {"domain": value}

    @classmethod
    def reads(cls, config: TeacherStudentConfig, role: str) -> dict[str, list[Any] | None]:
        # a teacher without it (another protocol's schema) showed no example, every episode
        if role in config.domains.values():
            return {"example": None}
        return {"answer": None} if role in (config.student, config.student_alone) else {}

    def next_role(self) -> str | None:
        return self.order[self.turn] if self.turn < len(self.order) else None

    def observe(self, role: str) -> dict[str, Any]:
        if role == self.teacher:
            return {"problem": self.worked["text"], "example": None, "domain": self.domain}
        example = self.example if role == self.config.student else None
        return {"problem": self.problem["text"], "example": example, "domain": self.domain}

    def recipients(self, sender: str) -> list[str]:
        return [self.config.student] if sender == self.teacher else []

    async def step(self, role: str, message: Message) -> StepResult:
        c = self.config
        self.turn += 1
        if role == self.teacher:
            text = (message.content or {}).get("example") if message.valid else None
            self.example = text.strip() if isinstance(text, str) and text.strip() else None
            return StepResult()
        self.answers[role] = whole_number(message)
        if role != c.student_alone:
            return StepResult()
        with_example, alone = (float(self.answers.get(r) == self.problem["answer"]) for r in (c.student, c.student_alone))
        return StepResult(rewards={c.student: with_example, self.teacher: with_example - alone,
                                   c.student_alone: alone}, done=True)

    def outcome(self) -> dict[str, Any]:
        return {"domain": self.domain, "worked": self.worked, "problem": self.problem, "example": self.example,
                "answers": self.answers}
