"""The data the training client takes and returns (names follow the Tinker API)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

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
        return self.tensor(key)


@dataclass(frozen=True)
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0 = no clipping


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class ForwardBackwardOutput:
    loss_fn_outputs: list[dict[str, torch.Tensor]]  # per datum: "logprobs" of its target tokens (0 where mask is 0)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class OptimStepResponse:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
