"""Episode transcripts to training datums, one role at a time.

Every model attempt of a role is an action: its sampled tokens get the sampling logprobs the
engine recorded and an advantage; prompt tokens are observations (mask 0). When an attempt's
prompt starts with the previous attempt's prompt + completion (a retry that shows the model its
own reply, or a multi-turn game that keeps the conversation), the two merge into one sequence,
so shared prefixes are computed once.

Attempts that stayed invalid follow ``invalid``: ``"penalize"`` trains them with
``invalid_advantage`` (format errors are pushed down whatever the episode's outcome), ``"drop"``
leaves them out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal

from ..transcript import Attempt, EpisodeRecord
from .types import Datum, ModelInput


@dataclass
class _Sequence:
    tokens: list[int]
    mask: list[float]
    logprobs: list[float]
    advantages: list[float]

    def extend_with(self, prompt: list[int], action: list[int], logprobs: list[float], advantage: float) -> bool:
        """Append when ``prompt`` continues this sequence; False when it does not."""
        n = len(self.tokens)
        if len(prompt) < n or prompt[:n] != self.tokens:
            return False
        self._append(prompt[n:], action, logprobs, advantage)
        return True

    def _append(self, prompt: list[int], action: list[int], logprobs: list[float], advantage: float) -> None:
        self.tokens += prompt + action
        self.mask += [0.0] * len(prompt) + [1.0] * len(action)
        self.logprobs += [0.0] * len(prompt) + list(logprobs)
        self.advantages += [0.0] * len(prompt) + [advantage] * len(action)

    @classmethod
    def start(cls, prompt: list[int], action: list[int], logprobs: list[float], advantage: float) -> "_Sequence":
        seq = cls([], [], [], [])
        seq._append(list(prompt), list(action), logprobs, advantage)
        return seq

    def to_datum(self) -> Datum:
        # position i predicts token i+1: shift targets (and their per-token data) left by one
        return Datum(
            model_input=ModelInput.from_ints(self.tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": self.tokens[1:],
                "mask": self.mask[1:],
                "logprobs": self.logprobs[1:],
                "advantages": self.advantages[1:],
            },
        )


@dataclass
class DatumBuildOptions:
    invalid: Literal["penalize", "drop"] = "penalize"
    invalid_advantage: float = -1.0
    merge: bool = True
    stats: dict[str, int] = field(default_factory=lambda: {"attempts": 0, "dropped": 0, "no_tokens": 0})


def role_datums(
    episode: EpisodeRecord, role: str, advantage: float, options: DatumBuildOptions | None = None
) -> list[Datum]:
    """Datums for ``role``'s attempts in one episode."""
    options = options or DatumBuildOptions()
    sequences: list[_Sequence] = []
    for attempt in _attempts(episode, role):
        options.stats["attempts"] += 1
        if not attempt.token_ids:
            options.stats["no_tokens"] += 1  # e.g. a replay or Python policy: nothing was sampled
            continue
        if not attempt.valid and options.invalid == "drop":
            options.stats["dropped"] += 1
            continue
        adv = advantage if attempt.valid else options.invalid_advantage
        args = (attempt.prompt_ids, attempt.token_ids, attempt.logprobs, adv)
        if not (options.merge and sequences and sequences[-1].extend_with(*args)):
            sequences.append(_Sequence.start(*args))
    return [s.to_datum() for s in sequences]


def _attempts(episode: EpisodeRecord, role: str) -> Iterable[Attempt]:
    for turn in episode.turns:
        if turn.role == role:
            yield from turn.attempts
