"""The data the training client takes and returns (names follow the Tinker API)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch
from pydantic import BaseModel, ValidationError

from ..config import AdamConfig, LoraSpec
from ..config_errors import first_error
from ..upload import host_tensor


@dataclass(frozen=True)
class ModelInput:
    tokens: tuple[int, ...]

    @classmethod
    def from_ints(cls, tokens: Sequence[int]) -> "ModelInput":
        return cls(tuple(int(t) for t in tokens))

    def to_ints(self) -> list[int]:
        return list(self.tokens)

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class GrammarSpan:
    """Targets ``[start, start + length)`` of a Datum were sampled under a JSON schema's mask.

    The training client replays the grammar (after ``prefix``, the reply text already in the
    prompt) to apply the same masks, so logprobs are those of the masked policy that sampled.
    """

    start: int
    length: int
    json_schema: str
    prefix: str = ""
    spelled: bool = False  # the sampler also cut the masks to the tokenizer's spellings (grammar/spelling.py)


@dataclass
class Datum:
    """One sequence. ``loss_fn_inputs`` are aligned with ``model_input`` position by position:

    - ``target_tokens``: the token each position predicts (the input shifted left by one);
    - ``mask`` (or Tinker's ``weights``): 1 where the loss applies (action tokens), 0 for prompts;
    - ``logprobs``: the sampler's logprob of each target token (RL losses);
    - ``advantages``: per-token advantage (RL losses).

    ``grammar`` (a rolecast extension): the spans sampled under constrained decoding.
    """

    model_input: ModelInput
    loss_fn_inputs: dict[str, Any]
    grammar: tuple[GrammarSpan, ...] = ()

    def tensor(self, key: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        t = host_tensor(self.loss_fn_inputs[key], dtype)
        if t.shape != (self.model_input.length,):
            raise ValueError(f"loss_fn_inputs[{key!r}] has shape {tuple(t.shape)}; expected ({self.model_input.length},)")
        return t

    def mask(self) -> torch.Tensor:
        key = "mask" if "mask" in self.loss_fn_inputs else "weights"
        if key not in self.loss_fn_inputs:
            return torch.ones(self.model_input.length)
        weights = self.tensor(key)
        # only positions weighted above 0 go through the LM head: a negative weight was a loss of 0
        # and no gradient (yet counted in the means), a NaN one a NaN loss
        if not bool((weights >= 0).all()):
            at = int((~(weights >= 0)).nonzero()[0])
            raise ValueError(f"loss_fn_inputs[{key!r}] holds {weights[at].item()} at position {at}: "
                             "a weight is 0 (no loss) or more")
        return weights


@dataclass(frozen=True)
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0 = no clipping

    def __post_init__(self) -> None:
        # a recipe's adam: checks: a NaN learning rate made every weight NaN, a negative one climbed
        # the loss, a negative grad_clip_norm left the gradient unclipped, all without a word
        checked_as(self, AdamConfig)


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        # a recipe's lora: checks: alpha 0 trained an adapter that changed nothing, a NaN one NaN weights
        checked_as(self, LoraSpec)


def checked_as(options: Any, model: type[BaseModel]) -> None:
    """The dataclass ``options`` checked as a recipe's ``model`` checks the same keys: a ValueError
    naming the first wrong one."""
    given = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(options).items()}
    try:
        model.model_validate(given)
    except ValidationError as exc:
        (option, *_), problem = first_error(exc, given, model)
        raise ValueError(f"{type(options).__name__}.{option}: {problem}") from None


class _Arriving:
    """A result whose fields may still be on their way from a GPU (``upload.Download``): given as a
    function that waits for them and returns them by name, called on the first read. The service's
    thread then hands over a call's result without waiting for the GPU, and goes on to queue the
    next call's work while the GPU finishes this one's."""

    _names: tuple[str, ...] = ()  # the fields, for repr

    def __init__(self, fields: dict[str, Any] | Callable[[], dict[str, Any]]):
        self._fields = fields

    def _field(self, name: str) -> Any:
        fields = self._fields  # one read: another thread may be replacing it (the wait is idempotent)
        if callable(fields):
            fields = self._fields = fields()
        return fields[name]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self._names)})"


# Per-token metrics whose names already say they are means over the action tokens (the others: NAME_mean).
MEAN_NAMED = frozenset({"kl", "approx_kl", "clip_fraction", "entropy"})


class ForwardBackwardOutput(_Arriving):
    """Per datum, ``{"logprobs": ...}`` of its target tokens (0 where its mask is 0); the call's metrics."""

    _names = ("loss_fn_outputs", "metrics")

    def __init__(self, loss_fn_outputs: list[dict[str, torch.Tensor]] | None = None,
                 metrics: dict[str, float] | None = None, *, later: Callable[[], dict[str, Any]] | None = None):
        super().__init__(later or {"loss_fn_outputs": loss_fn_outputs or [], "metrics": metrics or {}})

    loss_fn_outputs = property(lambda self: self._field("loss_fn_outputs"))
    metrics = property(lambda self: self._field("metrics"))


class OptimStepResponse(_Arriving):
    """The adapter's step count after the step, and its metrics: ``grad_norm`` (before clipping) and
    ``skipped_step`` (1.0 where a non-finite gradient left the weights as they were)."""

    _names = ("step", "metrics")

    def __init__(self, step: int, metrics: dict[str, float] | None = None, *,
                 later: Callable[[], dict[str, float]] | None = None):
        super().__init__((lambda: {"metrics": later()}) if later else {"metrics": metrics or {}})
        self.step = step  # known on the host: only the metrics arrive

    metrics = property(lambda self: self._field("metrics"))
