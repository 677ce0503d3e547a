"""Small host data sent to a GPU without waiting for it.

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
kind (tests/gpu checks that a steady decode step and a training pass make none).
"""
from __future__ import annotations

from typing import Any

import torch


def upload(values: Any, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` (a list, or a CPU tensor) as a tensor on ``device``, queued behind the work
    already on its stream rather than waited for. Off CUDA, the plain ``torch.as_tensor``."""
    if device.type != "cuda":
        return torch.as_tensor(values, dtype=dtype, device=device)
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if host.device.type == "cuda":
        return host.to(dtype=dtype)
    return host.to(dtype=dtype).pin_memory().to(device, non_blocking=True)


def move_together(tensors: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """``tensors`` on ``device`` in ``dtype``, moved in one copy: views of one flat tensor. A copy
    per tensor to or from a GPU waits for it each time (420 of them for SmolLM2's LoRA weights)."""
    flat = upload(torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors]), device)
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]
