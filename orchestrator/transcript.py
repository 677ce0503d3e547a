"""What an episode leaves behind: per role and turn, every attempt with its tokens and logprobs.

These records are the training data of the RL side, so they keep exactly what was sampled:
the prompt messages and prompt token ids, the sampled token ids, their sampling logprobs, the
adapter version, the parsed content, validity, retries, penalties and rewards.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_ERROR_CHARS = 2000


def error_text(exc: BaseException) -> str:
    """``Type: message`` of the fault that ended an episode, cut at MAX_ERROR_CHARS: a repo copy that
    failed on every file (shutil.Error lists them all) put a megabyte into one transcript line and
    the log's warning."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return f"{text[:MAX_ERROR_CHARS]}... ({len(text) - MAX_ERROR_CHARS} more characters)"


@dataclass
class Attempt:
    messages: list[dict[str, str]]
    text: str
    valid: bool
    errors: list[str]
    prompt_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    adapter: str | None = None
    adapter_version: int | None = None
    duration_s: float = 0.0
    # Constrained decoding: the schema the tokens were sampled under and the reply prefix its
    # grammar started after (training replays the masks), the tokens closed by force, and
    # whether the masks were cut to the tokenizer's own spellings (engines/base.Completion).
    json_schema: str | None = None
    reply_prefix: str = ""
    forced_tokens: int = 0
    spelled: bool = False
    completion_tokens: int | None = None  # tokens generated, where there are no token_ids (an API's usage)


@dataclass
class Turn:
    turn: int
    role: str
    message_id: str
    content: dict[str, Any] | None
    valid: bool
    retries: int
    penalty: float  # the role's invalid_penalty when the turn stayed invalid, else 0
    reward: float = 0.0  # environment reward credited at this step
    score: float | None = None  # the env's score of this move (training.turn_credit); None: not scored
    attempts: list[Attempt] = field(default_factory=list)


@dataclass
class EpisodeRecord:
    id: str
    index: int
    team: str
    task: dict[str, Any]
    seed: int
    adapters: dict[str, str] = field(default_factory=dict)  # per-role adapter overrides (self-play opponents)
    status: str = "running"  # ok | timeout | error | max_turns
    error: str | None = None
    turns: list[Turn] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)  # per role: env rewards + penalties
    # the roles that took a turn or that the env paid, in that order; None (an older transcript): all
    took_part: list[str] | None = None
    outcome: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def in_episode(self, role: str) -> bool:
        """Whether ``role`` took part: one that sat the episode out (the other domain's teacher)
        holds a 0 in ``rewards``, which is no result, and would halve its mean reward."""
        return self.took_part is None or role in self.took_part

    @property
    def failed(self) -> bool:
        """It ended in a fault (an error, or out of time): its rewards are placeholders, no result."""
        return self.status in ("error", "timeout")

    def dumps(self) -> str:
        """One JSONL line; serialises the records in place, without asdict's deep copy."""
        line = json.dumps(self, default=as_json, ensure_ascii=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a Python policy's text): UTF-8 has none, JSON's escape does
            return json.dumps(self, default=as_json)
        return line

    @classmethod
    def loads(cls, line: str | bytes) -> EpisodeRecord:
        """The record ``dumps`` wrote as ``line``."""
        data = json.loads(line)
        data["turns"] = [Turn(**{**t, "attempts": [Attempt(**a) for a in t["attempts"]]}) for t in data["turns"]]
        return cls(**data)


def as_json(value: Any) -> dict[str, Any]:
    """``json.dumps``'s ``default`` for the records: an object's attributes (a dataclass's fields)."""
    if not hasattr(value, "__dict__"):
        raise TypeError(f"{type(value).__name__} value {value!r} is not JSON data")
    return vars(value)
