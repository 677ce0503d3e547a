"""The one async interface every generation backend implements.

A request names the adapter (``None`` = the base model), carries already-tokenised prompt ids
and its sampling parameters; a completion carries the sampled tokens with the logprob each had
under the sampling distribution at the moment it was drawn, which RL's importance ratios need.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from ..config import MIN_TEMPERATURE, MIN_TOP_P, SEED_MAX

FinishReason = Literal["stop", "length", "eos", "cancelled", "error"]
# float32's largest: the sampler divides float32 logits by the temperature, and a larger one is inf
# there, which makes a grammar's banned logits (-inf / inf) NaN
_MAX_TEMPERATURE = 3.4028234663852886e38


class RequestRefused(ValueError):
    """A request the engine will not take, for what the request asks (its prompt, its sampling):
    the caller's to fix (serve's 400), where any other error inside the engine is the engine's."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # Keep sampling past an end-of-turn token (kept as an ordinary token) until max_tokens or a
    # stop string: fixed-length generation, for benchmarks and length-controlled experiments.
    ignore_eos: bool = False
    # Also report the N most likely tokens at each step (OpenAI's top_logprobs), from the distribution
    # the recorded logprobs are of.
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        """Refuse what the engine would only fail on mid-batch, taking its neighbours' rows along,
        or would read as something else (a bool as a number, "no" as true)."""
        t = self.temperature
        if not (_number(t) and (t == 0 or MIN_TEMPERATURE <= t <= _MAX_TEMPERATURE)):
            raise ValueError(f"temperature must be 0 (greedy) or a number >= {MIN_TEMPERATURE} "
                             f"(at most {_MAX_TEMPERATURE:.3g}, float32's largest), got {t!r}")
        if not (_number(self.top_p) and MIN_TOP_P <= self.top_p <= 1):
            raise ValueError(f"top_p must be in [{MIN_TOP_P:g}, 1], got {self.top_p!r}")
        if not (_number(self.max_tokens, int) and self.max_tokens >= 1):
            raise ValueError(f"max_tokens must be a whole number >= 1, got {self.max_tokens!r}")
        if not (isinstance(self.stop, tuple) and all(isinstance(t, str) for t in self.stop)):  # "" is ignored
            raise ValueError(f"stop must be a tuple of strings, got {self.stop!r}")
        if self.seed is not None and not (_number(self.seed, int) and 0 <= self.seed <= SEED_MAX):
            raise ValueError(f"seed must be a whole number from 0 to 2**63 - 1, got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not (_number(self.top_logprobs, int) and self.top_logprobs >= 0):
            raise ValueError(f"top_logprobs must be a whole number >= 0, got {self.top_logprobs!r}")


def _number(value: object, kind: type | tuple[type, ...] = (int, float)) -> bool:
    """``value`` is a ``kind`` and no bool (a bool is an int: max_tokens=True was one token)."""
    return isinstance(value, kind) and not isinstance(value, bool)


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str | None:
    """``text`` up to its earliest stop string, whatever their order (one token may complete two);
    None where it holds none."""
    found = [at for s in stop if s and (at := text.find(s)) != -1]
    return text[:min(found)] if found else None


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None
    # Constrain the reply to this JSON schema (``messages.schema_json`` text: canonical, so equal
    # schemas share a compiled grammar). The reply is then tight JSON (", " and ": ", no other
    # whitespace) with properties in the schema's order.
    json_schema: str | None = None
    # Reply text already at the end of ``prompt_ids`` (a role's reply_prefix): with a schema, the
    # grammar starts after it. A backend that cannot start a grammar mid-reply must not accept both.
    reply_prefix: str = ""


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    # logprobs[i] = log p(token_ids[i]) under softmax(logits / temperature) (raw logits when
    # temperature == 0), before top-p truncation: what a teacher-forced pass at the same
    # temperature reproduces. Under a json_schema, the distribution is the grammar-masked one,
    # renormalised over the allowed tokens (see docs/constrained.md).
    logprobs: list[float]
    finish_reason: FinishReason
    adapter: str | None = None
    adapter_version: int = 0
    # Trailing tokens that closed a constrained reply because max_tokens was running out: chosen
    # by the engine, not sampled (logprob 0.0); training treats them as observations.
    forced_tokens: int = 0
    # The grammar mask was also cut to the tokenizer's own spellings of a small language
    # (grammar/spelling.py): the training replay must cut it alike. The vLLM backend does not.
    spelled: bool = False
    # With sampling.top_logprobs = N: per token, up to N (token id, logprob) pairs, most likely first,
    # under the distribution of ``logprobs`` (tokens a grammar bans left out; none for forced tokens).
    top_logprobs: list[list[tuple[int, float]]] | None = None


@runtime_checkable
class Engine(Protocol):
    """What policies need from a backend: render chat to token ids, tokenise, generate."""

    async def generate(self, request: GenerationRequest) -> Completion: ...

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    async def aclose(self) -> None: ...


class AdapterVersions:
    """Each adapter's version, which only rises: (name, version) names one set of weights, in
    transcripts and in a prefix cache's keys, so no number is used twice, even for an adapter
    removed and added again, or across a resumed training run (``continue_versions``)."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}  # the adapters held, and their current versions
        self._floor: dict[str, int] = {}  # numbers an adapter has used, or was told it had used

    def next_version(self, name: str) -> int:
        return max(self.versions.get(name, 0), self._floor.get(name, 0)) + 1

    def continue_versions(self, name: str, last: int) -> None:
        """Number ``name``'s next weights after ``last`` (a resumed run's, as it checkpointed)."""
        self._floor[name] = max(self._floor.get(name, 0), last)

    def forget_version(self, name: str) -> None:
        """``name`` was removed: its numbers stay used."""
        self._floor[name] = max(self._floor.get(name, 0), self.versions.pop(name, 0))
