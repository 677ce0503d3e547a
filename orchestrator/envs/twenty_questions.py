"""``twenty_questions``: the guesser asks yes/no questions, then guesses the secret word.

    protocol:
      type: twenty_questions
      players: [guesser]
      answerer: answerer         # an LLM role that sees the secret (frozen: the base model)
      questions: 20
      split: train               # draw secrets from the train or the test words
      split_seed: 0
      test_fraction: 0.2
      rewards: {correct: 1.0, failed: 0.0}
      on_invalid: continue       # a guesser turn with no valid message uses up a question

The guesser sends ``{"action": "ask", "text": "Is it an animal?"}`` or ``{"action": "guess",
"text": "dog"}``; the one guess ends the game, and so does asking with no question left. The
answerer replies ``{"answer": "yes" | "no" | "unsure"}``; an invalid answer counts as "unsure".
Only the answerer observes the secret. The secret is the task's ``secret`` when given, else one
word of the split drawn from the episode's seeded RNG.
"""
from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, StrictStr, field_validator, model_validator

from ..messages import Message
from ..yamlfile import Loc
from .base import Options, StepResult, TaskConfig
from .game import GameConfig, GameEnv
from .words import split_words


class QuestionRewards(Options):
    correct: float = 1.0
    failed: float = 0.0


class TwentyQuestionsConfig(GameConfig):
    players: list[str] = Field(["guesser"], min_length=1, max_length=1)
    answerer: str = "answerer"
    questions: int = Field(20, ge=0, le=100)
    split: Literal["train", "test"] = "train"
    split_seed: int = 0
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    rewards: QuestionRewards = Field(default_factory=QuestionRewards)
    no_illegal_penalty: ClassVar[str] = "any question or guess is a legal move"

    @model_validator(mode="after")
    def _answerer_is_not_the_guesser(self) -> "TwentyQuestionsConfig":
        if self.answerer in self.players:  # it would see the secret, and its guesses were read as answers
            raise ValueError(f"the answerer {self.answerer!r} must be another role than the guesser")
        return self

    @model_validator(mode="after")
    def _split_has_words(self) -> "TwentyQuestionsConfig":
        train, test = split_words(self.split_seed, self.test_fraction)
        if not (train if self.split == "train" else test):  # every drawn secret would fail its episode
            raise ValueError(f"test_fraction {self.test_fraction} leaves the {self.split} split empty")
        return self

    def role_refs(self) -> list[tuple[Loc, str]]:
        return super().role_refs() + [(("answerer",), self.answerer)]

    def turns_needed(self) -> int:
        return 2 * self.questions + 1  # a question and its answer each, then the guess

    def opponent_role(self) -> str | None:
        return self.opponent or self.answerer


class TwentyQuestionsTask(TaskConfig):
    secret: StrictStr | None = None  # none: a word of the split, drawn from the episode's seeded RNG

    @field_validator("secret")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\s*[A-Za-z]+\s*", value):
            raise ValueError("the secret is one word of letters (a guess's last word is compared with it)")
        return value


IRREGULAR_PLURALS = {"mouse": "mice"}


def plurals(word: str) -> set[str]:
    """The plural forms a guess of ``word`` may take: -s, -es, and the word list's irregular ones
    (butterflies, knives, leaves, snowmen, mice), so a right guess in the plural is not lost."""
    forms = {word + "s", word + "es"}
    if word in IRREGULAR_PLURALS:
        forms.add(IRREGULAR_PLURALS[word])
    if re.search(r"[^aeiou]y$", word):
        forms.add(word[:-1] + "ies")
    if word.endswith(("f", "fe")):
        forms.add(word.removesuffix("e")[:-1] + "ves")
    if word.endswith("man"):
        forms.add(word[:-3] + "men")
    return forms


def same_word(guess: str, secret: str) -> bool:
    """The guess's last word is the secret (or its plural): "a dog", "Is it a dog?", "dogs"."""
    words = re.findall(r"[a-z]+", guess.lower())
    return bool(words) and words[-1] in {secret, *plurals(secret)}


class TwentyQuestionsEnv(GameEnv):
    Config = TwentyQuestionsConfig
    Task = TwentyQuestionsTask
    observation_keys = frozenset({"history", "questions", "questions_left", "secret", "question"})
    config: TwentyQuestionsConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        c = self.config
        if self.task.get("secret") is not None:
            self.secret = self.task["secret"].strip().lower()
        else:
            train, test = split_words(c.split_seed, c.test_fraction)
            self.secret = self.rng.choice(train if c.split == "train" else test)
        self.history: list[dict[str, str]] = []  # {"question", "answer"}
        self.used = 0  # questions asked, and guesser turns lost to invalid messages
        self.question: str | None = None  # waiting for the answerer
        self.guess: str | None = None

    @classmethod
    def task_from_cli(cls, value: str) -> dict[str, Any]:
        return {"secret": value}

    @classmethod
    def observes(cls, config: TwentyQuestionsConfig, role: str) -> frozenset[str]:
        return cls.observation_keys if role == config.answerer else cls.observation_keys - {"secret", "question"}

    @classmethod
    def reads(cls, config: TwentyQuestionsConfig, role: str) -> dict[str, list[Any] | None]:
        # a guesser that cannot say "guess" asked until its questions ran out, every game
        if role == config.answerer:
            return {"answer": None}
        return {"action": ["guess"], "text": None} if role in config.players else {}

    @property
    def guesser(self) -> str:
        return self.config.players[0]

    def next_role(self) -> str | None:
        if self.done:
            return None
        return self.config.answerer if self.question is not None else self.guesser

    def observe(self, role: str) -> dict[str, Any]:
        view: dict[str, Any] = {"history": list(self.history), "questions": self.config.questions,
                                "questions_left": self.config.questions - self.used}
        if role == self.config.answerer:  # the only view with the secret in it
            view.update(secret=self.secret, question=self.question)
        return view

    async def step(self, role: str, message: Message) -> StepResult:
        c = self.config
        if role == c.answerer:
            answer = (message.content or {}).get("answer", "unsure") if message.valid else "unsure"
            self.history.append({"question": self.question or "", "answer": answer})
            self.question = None
            return StepResult()
        if not message.valid:
            if c.on_invalid == "end":
                return self.forfeit(role, "invalid")
            self.used += 1
            return self._failed(role, "questions") if self.used > c.questions else StepResult()
        action, text = message.content.get("action"), str(message.content.get("text", ""))
        if action == "guess":
            self.guess = text
            if same_word(text, self.secret):
                return self.finish({role: "win"}, {role: c.rewards.correct}, "correct")
            return self._failed(role, "wrong_guess")
        if self.used >= c.questions:
            return self._failed(role, "questions")
        self.used += 1
        self.question = text
        return StepResult()

    def _failed(self, role: str, reason: str) -> StepResult:
        return self.finish({role: "loss"}, {role: self.config.rewards.failed}, reason)

    def outcome(self) -> dict[str, Any]:
        return {**super().outcome(), "secret": self.secret, "guess": self.guess, "questions_asked": len(self.history)}
