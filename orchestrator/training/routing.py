"""Training passes in which each row of a batch goes through its own LoRA adapter.

PEFT keeps the adapters' weights (and their files); its LoRA layers stay switched off, computing
only the base layer, and in the service's passes a forward hook here adds the deltas. The
adapters of a pass sit side by side as in the engine's ``MultiLoRA`` (``A`` as ``[R, in]``, ``B`` as ``[out, R]``
times each adapter's scale, ``R`` the sum of their ranks), so a module costs two matmuls
whatever the mix: ``h = x A^T``, zero each row's columns of other adapters, ``out += h B^T``.
The stacks are concatenations of the parameters, built once per block and shared by all its
forwards, so one backward sends each row's gradient into its own adapter's weights.
PEFT's own per-row path (its ``adapter_names`` argument: one gather, two matmuls and a scatter
per adapter per module) made a four-adapter pass slower than four passes.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from peft.tuners.lora import LoraLayer


class Routing:
    """The adapters of one block of passes, ``names``; ``route`` names each row's adapter before
    each forward."""

    def __init__(self, names: list[str], dropout: dict[str, float]):
        self.names, self.dropout = names, dropout
        self._stacks: dict[int, tuple[torch.Tensor, torch.Tensor, tuple[str, ...], tuple[int, ...]]] = {}
        self._rows: list[str] = []
        self._only: str | None = None  # the adapter of every row, where they share one
        self._masks: dict[tuple[tuple[str, ...], tuple[int, ...]], torch.Tensor] = {}
        self._keep: torch.Tensor | None = None  # [rows, 1, 1]: 1 - each row's dropout probability

    def route(self, rows: list[str]) -> None:
        """The adapter of each row of the next forward, in order."""
        self._rows, self._masks = list(rows), {}
        self._only = rows[0] if len(set(rows)) == 1 else None
        keep = [1.0 - self.dropout.get(n, 0.0) for n in rows]
        self._keep = torch.tensor(keep)[:, None, None] if min(keep) < 1.0 else None

    def _stack(self, module: LoraLayer) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...], tuple[int, ...]]:
        """The module's ``A`` [R, in] and scaled ``B`` [out, R] of this block's adapters side by side
        (in ``nn.Linear``'s layout, so the matmuls are the ones PEFT's own layers run)."""
        if id(module) not in self._stacks:
            present = tuple(n for n in self.names if n in module.lora_A)
            a = torch.cat([module.lora_A[n].weight for n in present]) if present else None
            b = torch.cat([module.lora_B[n].weight * module.scaling[n] for n in present], dim=1) if present else None
            self._stacks[id(module)] = (a, b, present, tuple(module.lora_A[n].weight.shape[0] for n in present))
        return self._stacks[id(module)]

    def _mask(self, present: tuple[str, ...], ranks: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """[rows, 1, R]: ones in each row's own adapter's columns (none where the module lacks it)."""
        if (present, ranks) not in self._masks:
            mask = torch.zeros(len(self._rows), 1, sum(ranks))
            offsets = {n: (sum(ranks[:i]), ranks[i]) for i, n in enumerate(present)}
            for r, name in enumerate(self._rows):
                if name in offsets:
                    start, rank = offsets[name]
                    mask[r, 0, start:start + rank] = 1.0
            self._masks[(present, ranks)] = mask.to(device)
        return self._masks[(present, ranks)]

    def add_delta(self, module: LoraLayer, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        a, b, present, ranks = self._stack(module)
        if not present:
            return output
        x = inputs[0]
        if self._keep is not None and module.training:  # each row's own adapter's LoRA dropout
            keep = self._keep.to(x.device, x.dtype)
            x = x * (torch.rand(x.shape, device=x.device) < keep).to(x.dtype) / keep
        if not torch.is_autocast_enabled(x.device.type):
            x = x.to(a.dtype)
        h = F.linear(x, a)
        if not (len(present) == 1 and self._only == present[0]):
            h = h * self._mask(present, ranks, h.device).to(h.dtype)
        return output + F.linear(h, b).to(output.dtype)


@contextlib.contextmanager
def routed(peft, names: list[str]) -> Iterator[Routing]:
    """``names``' deltas through ``Routing`` in this block's forwards. PEFT's layers must be
    switched off (``disable_adapter_layers``: they compute only their base layers)."""
    dropout = {n: float(peft.peft_config[n].lora_dropout) for n in names}
    routing = Routing(names, dropout)
    layers = [m for m in peft.modules() if isinstance(m, LoraLayer)]
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
