"""``guess_number``: find a secret integer; a Python function answers too high / too low / correct.

    protocol:
      type: guess_number
      players: [guesser]
      low: 1
      high: 16
      turns: 5
      rewards: {correct: 1.0, failed: 0.0}
      illegal_penalty: -1.0      # a guess outside [low, high]: the game ends
      on_invalid: continue       # an unparseable turn uses up a turn (end: the game ends)
      process: consistent        # how each guess is scored; halving: see below

Each valid guess gets a score (``Turn.score``, for ``training.turn_credit``); the outcome's
process reward is their mean over the turns taken (an invalid turn counts 0). ``consistent``
scores 1 for a guess inside the range the feedback so far left possible. ``halving`` scores what
such a guess rules out for sure against what the midpoint would (1 at the midpoint, 0.625 for 5
and 1/8 at an edge of 1..16): stepping towards the secret one number at a time keeps every guess
consistent, but only halving finds secrets that training never showed. A guess outside that
range scores 0 either way.

The guesser's message is ``{"guess": 7}`` (the JSON field replaces a ``Guess: 7`` line). The
secret is the task's ``secret`` when it has one, else drawn from the episode's seeded RNG.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, StrictInt, ValidationInfo, field_validator, model_validator

from ..messages import Message
from .base import Options, StepResult, TaskConfig, task_protocol
from .game import GameConfig, GameEnv


class GuessRewards(Options):
    correct: float = 1.0
    failed: float = 0.0  # turns ran out


class GuessNumberConfig(GameConfig):
    players: list[str] = Field(["guesser"], min_length=1, max_length=1)
    low: int = 1
    high: int = 16
    turns: int = Field(5, ge=1, le=100)
    rewards: GuessRewards = Field(default_factory=GuessRewards)
    process: Literal["consistent", "halving"] = "consistent"

    def turns_needed(self) -> int:
        return self.turns

    @model_validator(mode="after")
    def _range(self) -> "GuessNumberConfig":
        if self.high <= self.low:
            raise ValueError(f"high ({self.high}) must be greater than low ({self.low})")
        return self


class GuessNumberTask(TaskConfig):
    secret: StrictInt | None = None  # none: drawn from the episode's seeded RNG

    @field_validator("secret")
    @classmethod
    def _in_range(cls, value: int | None, info: ValidationInfo) -> int | None:
        c = task_protocol(info)
        if value is not None and c is not None and not c.low <= value <= c.high:
            raise ValueError(f"outside the protocol's range [{c.low}, {c.high}]")
        return value


def feedback(guess: int, secret: int) -> str:
    return "correct" if guess == secret else "too high" if guess > secret else "too low"


class GuessNumberEnv(GameEnv):
    Config = GuessNumberConfig
    Task = GuessNumberTask
    observation_keys = frozenset({"low", "high", "turns", "turns_left", "history", "feedback", "lowest", "highest"})
    scores_moves = True
    config: GuessNumberConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        c = self.config
        secret = self.task.get("secret")
        self.secret = secret if secret is not None else self.rng.randint(c.low, c.high)
        self.history: list[dict[str, Any]] = []  # {"guess": int | None, "feedback": str}
        self.scores = 0.0  # the guesses' scores so far (the module's docstring)

    @classmethod
    def task_from_cli(cls, value: str) -> dict[str, Any]:
        try:
            return {"secret": int(value)}
        except ValueError:
            raise ValueError(f"the secret is a whole number, got {value!r}") from None

    @classmethod
    def reads(cls, config: GuessNumberConfig, role: str) -> dict[str, list[Any] | None]:
        # a role without it (another protocol's schema) lost every game on its first turn, as illegal
        return {"guess": None} if role in config.players else {}

    def next_role(self) -> str | None:
        return None if self.done else self.config.players[0]

    def observe(self, role: str) -> dict[str, Any]:
        return {
            "low": self.config.low,
            "high": self.config.high,
            "turns": self.config.turns,
            "turns_left": self.config.turns - len(self.history),
            "history": list(self.history),
            "feedback": self.history[-1]["feedback"] if self.history else None,
            # what the feedback so far leaves possible (the answers restated, nothing more)
            **dict(zip(("lowest", "highest"), self._possible())),
        }

    def _possible(self) -> tuple[int, int]:
        """The range the feedback so far leaves possible."""
        return (max([self.config.low] + [h["guess"] + 1 for h in self.history if h["feedback"] == "too low"]),
                min([self.config.high] + [h["guess"] - 1 for h in self.history if h["feedback"] == "too high"]))

    async def step(self, role: str, message: Message) -> StepResult:
        c = self.config
        score = None  # an invalid turn has no guess to score
        if not message.valid:
            self.history.append({"guess": None, "feedback": "invalid"})
            if c.on_invalid == "end":
                return self.forfeit(role, "invalid")
        else:
            guess = (message.content or {}).get("guess")
            if not isinstance(guess, int) or isinstance(guess, bool) or not c.low <= guess <= c.high:
                self.history.append({"guess": guess, "feedback": "illegal"})  # a turn taken: 0 in the process mean
                return replace(self.forfeit(role, "illegal"), score=0.0)
            score = self._score(guess, *self._possible())
            self.scores += score
            self.history.append({"guess": guess, "feedback": feedback(guess, self.secret)})
            if guess == self.secret:
                return replace(self.finish({role: "win"}, {role: c.rewards.correct}, "correct"), score=score)
        if len(self.history) >= c.turns:
            return replace(self.finish({role: "loss"}, {role: c.rewards.failed}, "turns"), score=score)
        return StepResult(score=score)

    def _score(self, guess: int, lowest: int, highest: int) -> float:
        if not lowest <= guess <= highest:
            return 0.0
        if self.config.process == "consistent":
            return 1.0
        n = highest - lowest + 1
        ruled_out = n - max(guess - lowest, highest - guess)  # for sure, whichever way the answer goes
        return ruled_out / (n - n // 2)  # the midpoint leaves at most n // 2

    def outcome(self) -> dict[str, Any]:
        used = self.scores / len(self.history) if self.history else 0.0
        return {**super().outcome(), "secret": self.secret, "guesses": len(self.history),
                "process": {self.config.players[0]: used}}
