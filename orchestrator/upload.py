"""Small host data sent to a GPU, and results read back from it, without waiting for it.

The engine sends a little each decode step (the token ids of rows prefilled since, each row's
adapter slot, temperatures, the sampling uniforms, grammar bitmasks), and the training client
each pass (token ids, masks, positions, targets, advantages). ``torch.tensor(values,
device="cuda")``, or ``.to("cuda")`` of an ordinary CPU tensor, copies from pageable memory and
then synchronises the stream: the host waits until every kernel queued before the copy has run.
The static decode path launches step t+1 before it books step t (``hf.HFEngine._static_iteration``),
so one such copy a step makes the host wait for the step it just launched and leaves the GPU idle
while the host does the rest of its work; in a training pass, each one drains the GPU before the
host has queued what comes next. From pinned memory, with ``non_blocking``, the copy is queued on
the stream like a kernel; PyTorch's pinned allocator holds the staging block until the copy has
run, so the CPU side may be dropped at once. ``torch.cuda.set_sync_debug_mode`` flags the other
kind (tests/gpu checks that a steady decode step and a training call make none). Results go the
other way in a ``Download``: queued copies into pinned memory and an event, waited for only where
the host reads them.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

_NUMPY = {torch.float32: np.float32, torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_}


def host_tensor(values: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` (a tensor, an array, or numbers in nested lists) as a tensor, of ``dtype`` where given,
    else of ``torch.tensor``'s choice. Lists go through numpy: a quarter of ``torch.tensor``'s
    time (64 x 512 token ids: 1.4 against 7.6 ms), which a training pass spends before its first
    kernel, with the GPU idle."""
    if isinstance(values, torch.Tensor):
        return values if dtype is None else values.to(dtype)
    if dtype is not None and dtype not in _NUMPY:
        return torch.tensor(values, dtype=dtype)
    host = torch.from_numpy(np.asarray(values, dtype=_NUMPY.get(dtype)))
    if dtype is None and host.dtype == torch.float64 and not isinstance(values, np.ndarray):
        return host.to(torch.get_default_dtype())  # Python floats, which torch.tensor makes float32
    return host


def upload(values: Any, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` (numbers in lists, an array or a tensor) as a tensor on ``device``, queued behind the
    work already on its stream rather than waited for."""
    host = host_tensor(values, dtype)
    if device.type != "cuda" or host.device.type == "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def move_together(tensors: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """``tensors`` on ``device`` in ``dtype``, moved in one copy: views of one flat tensor. A copy
    per tensor to or from a GPU waits for it each time (420 of them for SmolLM2's LoRA weights)."""
    flat = upload(torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors]), device)
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


class Download:
    """``tensors`` on their way to the host: copies into pinned memory queued behind the work that
    makes them, then an event. ``get`` waits for that event alone, not for work queued after it,
    so whoever made them can go on queueing work meanwhile. Off a GPU they are in hand."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self._ready: torch.cuda.Event | None = None
        if not tensors or tensors[0].device.type != "cuda":
            self._host = tuple(t.detach().cpu() for t in tensors)
            return
        self._host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors)
        for host, t in zip(self._host, tensors):
            host.copy_(t.detach(), non_blocking=True)
        self._ready = torch.cuda.Event()
        self._ready.record()

    def get(self) -> tuple[torch.Tensor, ...]:
        """The host tensors, once their copies have run."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host
