"""The static decode step, captured once per shape as a CUDA graph and replayed.

A decode step of a small model is hundreds of small kernels; launched one by one from Python,
their launch cost, not the GPU's arithmetic or memory, sets the step's time. A CUDA graph
records the kernels of one call and replays them with a single launch. It replays fixed
addresses and shapes, so the step reads its inputs from buffers that never move (the token ids,
``slots.SlotKV``, ``lora.SlotLoRA``), and a graph is kept per shape: a bucket of rows, a window of
columns, and whether any row uses an adapter. Buckets round up, so a handful of graphs serve a
run whose batch and lengths change every step; when the buffers move (``generation``), the
graphs are dropped and captured again on demand.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Callable, Hashable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def rows_bucket(rows: int, slots: int) -> int:
    """Rows a step covers for ``rows`` running: powers of two to 8, then multiples of 16 to 128,
    then of 32 (never more than the ``slots`` there are)."""
    step = 1 << (rows - 1).bit_length() if rows <= 8 else 16 if rows <= 128 else 32
    return min(-(-rows // step) * step, slots)


def window_bucket(needed: int, columns: int) -> int:
    """Columns a step reads when the longest row needs ``needed``: multiples of 64 to 512, then
    of 256 to 4096, then of 1024 (never more than the ``columns`` there are)."""
    step = 64 if needed <= 512 else 256 if needed <= 4096 else 1024
    return min(-(-needed // step) * step, columns)


class CaptureRefused(RuntimeError):
    """The GPU would not capture a step as a graph: the step can still run eagerly."""


class StepGraphs:
    """``step(*shape)`` replayed from a CUDA graph per shape; captured on first use."""

    def __init__(self, step: Callable[..., torch.Tensor], device: torch.device):
        self.step = step
        self.device = device
        self.captured = 0  # graphs captured so far (a count for logs and tests)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._generation: Hashable = None
        self._pool = None

    def __call__(self, shape: tuple, generation: Hashable) -> torch.Tensor:
        """The step's output for ``shape``; ``generation`` names the buffers the graphs read."""
        if generation != self._generation:
            self._graphs.clear()
            self._pool = None  # a pool whose graphs are all gone is released: its handle must not be reused
            self._generation = generation
        entry = self._graphs.get(shape)
        if entry is None:
            entry = self._graphs[shape] = self._capture(shape)
        graph, out = entry
        graph.replay()
        return out

    @property
    def shapes(self) -> list[tuple]:
        return list(self._graphs)

    def replay_seconds(self, shape: tuple, repeats: int = 50) -> float:
        """The GPU time of one replay of ``shape``'s graph (its launch included, no host work)."""
        graph, _ = self._graphs[shape]
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        for _ in range(repeats):
            graph.replay()
        torch.cuda.synchronize(self.device)
        return (time.perf_counter() - start) / repeats

    def _capture(self, shape: tuple) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # One eager run on a side stream first: lazy initialisations (cuBLAS handles and
        # workspaces) must not happen inside a capture. The step only writes what its inputs
        # determine (this step's keys and values), so running it twice changes nothing.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.step(*shape)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()  # one pool: graphs replay one at a time
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = self.step(*shape)
        except BaseException as exc:
            self._pool = None  # its failed capture may have released it: a new pool for the next one
            if isinstance(exc, RuntimeError):  # not a replay's fault (out of memory, a device assert)
                raise CaptureRefused(str(exc)) from exc
            raise
        self.captured += 1
        return graph, out


def count_kernels(call: Callable[[], object]) -> Counter:
    """The kernels ``call()`` launches, by aten op, counted on any device: what a graph of it would
    replay on a GPU, where a small model's decode step costs a few microseconds per kernel.

    Composite ops are followed down to the ops that do the work (a ``reshape`` that copies shows as
    a ``clone``, ``softmax(dtype=...)`` as its casts); views and allocations launch nothing and are
    left out. RMSNorm counts as one kernel, as torch's CUDA build runs it, wherever this runs. An
    estimate: an op may launch more than one kernel (``baddbmm`` first copies its broadcast bias
    into its output), which a profiler on the GPU would show.
    """
    counter = _KernelCounter()
    with counter:
        call()
    return counter.kernels


class _KernelCounter(TorchDispatchMode):
    _FUSED = {torch.ops.aten.rms_norm.default}
    _FREE = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default, torch.ops.aten._unsafe_view.default}

    def __init__(self):
        super().__init__()
        self.kernels: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self._FUSED:
            with self:  # a composite op's parts come through here too
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if not func.is_view and func not in self._FREE:
            self.kernels[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)
