"""Training passes in which each row of a batch goes through its own LoRA adapter.

PEFT keeps the adapters' weights (and their files); its LoRA layers stay switched off, computing
only the base layer, and in the service's passes a forward hook here adds the deltas. The
adapters of a pass sit side by side as in the engine's ``MultiLoRA`` (``A`` as ``[R, in]``, ``B`` as
``[out, R]``, ``R`` the sum of their ranks), so a module costs two matmuls whatever the mix:
``h = x A^T``, each row's columns of other adapters zeroed and its own scaled by its alpha / r
(one multiply), ``out += h B^T``; with one adapter for every row, its own weights, ``h`` times
its scale. The stacks are concatenations of the parameters, built once per block and shared by
all its forwards, so one backward sends each row's gradient into its own adapter's weights.
PEFT's own per-row path (its ``adapter_names`` argument: one gather, two matmuls and a scatter
per adapter per module) made a four-adapter pass slower than four passes.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import torch
import torch.nn.functional as F
from peft.tuners.lora import LoraLayer

from ..upload import upload


class Routing:
    """The adapters of one block of passes, ``names``; ``route`` names each row's adapter before
    each forward."""

    def __init__(self, names: list[str], dropout: dict[str, float]):
        self.names, self.dropout = names, dropout
        self._stacks: dict[int, _Stack] = {}
        self._rows: list[str] = []
        self._only: str | None = None  # the adapter of every row, where they share one
        self._masks: dict[tuple, torch.Tensor] = {}
        self._keep: torch.Tensor | None = None  # [rows, 1, 1]: 1 - each row's dropout probability

    def route(self, rows: list[str]) -> None:
        """The adapter of each row of the next forward, in order."""
        self._rows, self._masks = list(rows), {}
        self._only = rows[0] if len(set(rows)) == 1 else None
        keep = [1.0 - self.dropout.get(n, 0.0) for n in rows]
        self._keep = torch.tensor(keep)[:, None, None] if min(keep) < 1.0 else None

    def _stack(self, module: LoraLayer) -> "_Stack":
        """The module's ``A`` [R, in] and ``B`` [out, R] of this block's adapters side by side (in
        ``nn.Linear``'s layout, so the matmuls are the ones PEFT's own layers run); one adapter's
        are its own weights, not copies."""
        if id(module) not in self._stacks:
            present = tuple(n for n in self.names if n in module.lora_A)
            a = [module.lora_A[n].weight for n in present]
            b = [module.lora_B[n].weight for n in present]
            self._stacks[id(module)] = _Stack(
                torch.cat(a) if len(a) > 1 else a[0] if a else None, torch.cat(b, dim=1) if len(b) > 1 else b[0] if b else None,
                present, tuple(w.shape[0] for w in a), tuple(float(module.scaling[n]) for n in present))
        return self._stacks[id(module)]

    def _mask(self, stack: "_Stack", device: torch.device) -> torch.Tensor:
        """[rows, 1, R]: each row's own adapter's scale in its columns, 0 elsewhere (all 0 where the
        module lacks it): routing and LoRA's alpha / r in one multiply."""
        key = (stack.present, stack.ranks, stack.scales)
        if key not in self._masks:
            mask = torch.zeros(len(self._rows), 1, sum(stack.ranks))
            offsets = {n: (sum(stack.ranks[:i]), stack.ranks[i], stack.scales[i]) for i, n in enumerate(stack.present)}
            for r, name in enumerate(self._rows):
                if name in offsets:
                    start, rank, scale = offsets[name]
                    mask[r, 0, start:start + rank] = scale
            self._masks[key] = upload(mask, device)
        return self._masks[key]

    def add_delta(self, module: LoraLayer, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        stack = self._stack(module)
        if not stack.present:
            return output
        x = inputs[0]
        # each row's own adapter's LoRA dropout, in passes that take a gradient: forward() gives the
        # logprobs of the policy the engine samples, not of a random thinning of it
        if self._keep is not None and module.training and torch.is_grad_enabled():
            keep = self._keep.to(x.device, x.dtype)
            x = x * (torch.rand(x.shape, device=x.device) < keep).to(x.dtype) / keep
        if not torch.is_autocast_enabled(x.device.type):
            x = x.to(stack.a.dtype)
        h = F.linear(x, stack.a)  # [.., R]: the scale goes here, where the tensor is narrowest
        if len(stack.present) == 1 and self._only == stack.present[0]:  # every row through the one adapter
            h = h * stack.scales[0]
        else:
            h = h * self._mask(stack, h.device).to(h.dtype)
        return output + F.linear(h, stack.b).to(output.dtype)


class _Stack(NamedTuple):
    a: torch.Tensor | None  # [R, in]
    b: torch.Tensor | None  # [out, R]
    present: tuple[str, ...]  # the block's adapters this module has, in column order
    ranks: tuple[int, ...]
    scales: tuple[float, ...]  # alpha / r of each


def lora_layers(peft) -> list[LoraLayer]:
    """``peft``'s LoRA layers (a walk over every module: done when adapters are added, not per pass)."""
    return [m for m in peft.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def routed(peft, names: list[str], layers: list[LoraLayer]) -> Iterator[Routing]:
    """``names``' deltas through ``Routing`` in this block's forwards, on ``peft``'s LoRA ``layers``
    (``lora_layers``). PEFT's layers must be switched off (``disable_adapter_layers``: they compute
    only their base layers)."""
    dropout = {n: float(peft.peft_config[n].lora_dropout) for n in names}
    routing = Routing(names, dropout)
    handles = [m.register_forward_hook(lambda module, inputs, output: routing.add_delta(module, inputs, output))
               for m in layers]
    for m in layers:  # switching PEFT's layers off froze every adapter's weights
        for n in names:
            if n in m.lora_A:
                m.lora_A[n].requires_grad_(True)
                m.lora_B[n].requires_grad_(True)
    try:
        yield routing
    finally:
        for handle in handles:
            handle.remove()
