"""Episode transcripts to training datums, one role at a time.

Every model attempt of a role is an action: its sampled tokens get the sampling logprobs the
engine recorded and an advantage; prompt tokens are observations (mask 0). When an attempt's
prompt starts with the previous attempt's prompt + completion (a retry that shows the model its
own reply, or a multi-turn game that keeps the conversation), the two merge into one sequence,
so shared prefixes are computed once.

Constrained attempts (sampled under their schema's mask) carry a GrammarSpan, so training
applies the same masks; tokens that closed a reply by force are observations (mask 0).

A turn's valid attempt adds the turn's own extra advantage (``turn_extra``: turn-level credit,
turn_credit.py) to the episode's.

Invalid attempts (a retried one too, in a turn that ended valid) follow ``invalid``:
``"penalize"`` trains them with ``invalid_advantage`` (format errors are pushed down whatever the
episode's outcome), ``"drop"`` leaves them out. Attempts sampled by an adapter version older than ``min_version`` (async
training's staleness bound) are left out too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping

from ..transcript import Attempt, EpisodeRecord
from .types import Datum, GrammarSpan, ModelInput


@dataclass
class _Sequence:
    tokens: list[int]
    mask: list[float]
    logprobs: list[float]
    advantages: list[float]
    grammar: list[GrammarSpan] = field(default_factory=list)

    def extend_with(self, attempt: Attempt, advantage: float) -> bool:
        """Append when the attempt's prompt continues this sequence; False when it does not."""
        n, prompt = len(self.tokens), attempt.prompt_ids
        if len(prompt) < n or prompt[:n] != self.tokens:
            return False
        self._append(prompt[n:], attempt, advantage)
        return True

    def _append(self, prompt: list[int], attempt: Attempt, advantage: float) -> None:
        action = list(attempt.token_ids)
        sampled = len(action) - attempt.forced_tokens  # forced closing tokens: not the policy's choice
        if attempt.json_schema:  # targets are shifted by one: token i is predicted at position i - 1
            start = len(self.tokens) + len(prompt) - 1
            self.grammar.append(GrammarSpan(start, len(action), attempt.json_schema, attempt.reply_prefix, attempt.spelled))
        self.tokens += list(prompt) + action
        self.mask += [0.0] * len(prompt) + [1.0] * sampled + [0.0] * attempt.forced_tokens
        self.logprobs += [0.0] * len(prompt) + list(attempt.logprobs)
        self.advantages += [0.0] * len(prompt) + [advantage] * len(action)

    @classmethod
    def start(cls, attempt: Attempt, advantage: float) -> "_Sequence":
        seq = cls([], [], [], [])
        seq._append(list(attempt.prompt_ids), attempt, advantage)
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
            grammar=tuple(self.grammar),
        )


@dataclass
class DatumBuildOptions:
    invalid: Literal["penalize", "drop"] = "penalize"
    invalid_advantage: float = -1.0
    merge: bool = True
    min_version: int | None = None  # attempts sampled by an older adapter version are stale: dropped
    stats: dict[str, int] = field(default_factory=lambda: {"attempts": 0, "dropped": 0, "no_tokens": 0, "stale": 0})
    versions: list[int] = field(default_factory=list)  # the adapter version of each attempt kept that has one


def role_datums(
    episode: EpisodeRecord, role: str, advantage: float, options: DatumBuildOptions | None = None,
    turn_extra: Mapping[int, float] | None = None,
) -> list[Datum]:
    """Datums for ``role``'s attempts in one episode; ``turn_extra``: turn number -> advantage added
    to that turn's valid attempt."""
    options = options or DatumBuildOptions()
    turn_extra = turn_extra or {}
    sequences: list[_Sequence] = []
    for turn, attempt in _attempts(episode, role):
        options.stats["attempts"] += 1
        if not attempt.token_ids:
            options.stats["no_tokens"] += 1  # e.g. a replay or Python policy: nothing was sampled
            continue
        version = attempt.adapter_version
        if options.min_version is not None and version is not None and version < options.min_version:
            options.stats["stale"] += 1
            continue
        if not attempt.valid and options.invalid == "drop":
            options.stats["dropped"] += 1
            continue
        if version is not None:
            options.versions.append(version)
        adv = advantage + turn_extra.get(turn, 0.0) if attempt.valid else options.invalid_advantage
        if not (options.merge and sequences and sequences[-1].extend_with(attempt, adv)):
            sequences.append(_Sequence.start(attempt, adv))
    return [s.to_datum() for s in sequences]


def _attempts(episode: EpisodeRecord, role: str) -> Iterable[tuple[int, Attempt]]:
    for turn in episode.turns:
        if turn.role == role:
            yield from ((turn.turn, a) for a in turn.attempts)
