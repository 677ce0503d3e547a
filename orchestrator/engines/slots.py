"""A static KV cache for the GPU's decode path: every running row owns a fixed slot.

``kv.BatchKV`` keeps the batch left-padded to a common end column, which suits the CPU: a step
writes one column for every row. A step replayed as a CUDA graph needs the opposite: tensors at
fixed addresses and of fixed shapes. Here keys and values live in one buffer per kind,
``[layers, slots, kv_heads, columns, head_dim]``, allocated once (and regrown, rarely, by
doubling the columns). Row i of the batch is slot i; its tokens sit in columns ``[0, lens[i])``
from the left, so its next key goes to column ``lens[i]``, a per-row index that lives on the
device and moves without the host. A decode step covers a bucket of ``step_rows`` slots (the
running rows and idle slots after them, whose writes land in their own column 0 and are never
read) and a window of ``window`` columns; the attention mask comes from ``lens``.

A finished row leaves by the last row moving into its slot (one copy of that row), not by every
later row moving up. Newcomers join in fresh slots after the running rows (``open``): a prefix
found in the prefix cache is copied in, and the rest of each prompt goes through the same fused
step as decoding, a chunk (``chunk``) of ``step_width`` tokens per row over slots ``[step_first,
step_first + step_rows)``, each token attending to its row's columns before it (``banned``, ``write``).
"""
from __future__ import annotations

import itertools
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from .attention import banned_columns
from ..upload import upload

_MIN_COLUMNS = 512
_GENERATIONS = itertools.count(1)


class SlotKV:
    def __init__(self, device: torch.device | str, slots: int) -> None:
        self.device = torch.device(device)
        self.slots = slots
        self.keys: torch.Tensor | None = None  # [layers, slots, H, columns, D]
        self.values: torch.Tensor | None = None
        self.lens = torch.zeros(slots, dtype=torch.long, device=self.device)  # tokens held, per slot
        self.lengths: list[int] = []  # the host's copy, for the running rows
        self.generation = 0  # changes when the buffers move: graphs captured over them are stale
        self.step_rows = 0  # the bucket a step covers (>= rows); the engine sets both before a step
        self.window = 0  # columns a step reads (> every running row's length)
        self.chunk = False  # the step is a prefill chunk: rows from step_first, step_width tokens each
        self.step_first, self.step_width = 0, 1
        self._columns = torch.arange(0, device=self.device)
        self._rows = torch.arange(slots, device=self.device)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        return 0 if self.keys is None else self.keys.shape[3]

    # -- rows joining and leaving --------------------------------------------------------------
    def append(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Add prefilled rows: their cache ``[n, H, W, D]`` per layer, real tokens where ``mask`` is 1."""
        keys = torch.stack([layer.keys for layer in cache.layers])  # [layers, n, H, W, D]
        values = torch.stack([layer.values for layer in cache.layers])
        n, width = mask.shape
        if self.rows + n > self.slots:
            raise ValueError(f"{self.rows + n} rows do not fit in {self.slots} slots")
        lengths = mask.sum(dim=1).tolist()
        if self.keys is None:
            layers, _, heads, _, dim = keys.shape
            self._allocate(layers, heads, dim, keys.dtype, max(_MIN_COLUMNS, 2 * width))
        elif width > self.columns:
            self._grow(2 * width)
        # Each row's real columns first, in order (stable sort of "is padding"): a gather moves them left.
        order = torch.argsort((mask == 0).to(torch.int8), dim=1, stable=True).to(self.device)
        index = order[None, :, None, :, None].expand_as(keys)
        first = self.rows
        self.keys[:, first:first + n, :, :width] = torch.gather(keys, 3, index)
        self.values[:, first:first + n, :, :width] = torch.gather(values, 3, index)
        self.lens[first:first + n] = upload(lengths, self.device)
        self.lengths += lengths

    def open(self, prefixes: list[tuple[int, Any]], shape: tuple[int, int, int, torch.dtype]) -> int:
        """Add rows in fresh slots, each starting from its prefix ``(n, entry)``: the first n tokens'
        keys and values of a prefix-cache entry, copied in (``(0, None)``: none). ``shape``:
        (layers, kv_heads, head_dim, dtype), for the first rows. Returns the first new row; the
        rests of the prompts then go through the step in chunks (``step_first``, ``fed``)."""
        n = len(prefixes)
        if self.rows + n > self.slots:
            raise ValueError(f"{self.rows + n} rows do not fit in {self.slots} slots")
        lengths = [count for count, _ in prefixes]
        if self.keys is None:
            self._allocate(*shape, max(_MIN_COLUMNS, 2 * max(lengths)))
        elif max(lengths) > self.columns:
            self._grow(2 * max(lengths))
        first = self.rows
        for i, (count, entry) in enumerate(prefixes):
            if count:  # one copy per kind: an entry holds all its layers (``row``), or a list of them
                for buffer, stored in ((self.keys, entry.keys), (self.values, entry.values)):
                    stored = stored if isinstance(stored, torch.Tensor) else torch.stack(stored)
                    buffer[:, first + i, :, :count] = stored[:, :, :count]
        self.lens[first:first + n] = upload(lengths, self.device)
        self.lengths += lengths
        return first

    def fed(self, first: int, counts: list[int]) -> None:
        """Account for a prefill chunk that added ``counts`` tokens to rows ``first`` onward."""
        self.lens[first:first + len(counts)] += upload(counts, self.device)
        self.lengths[first:first + len(counts)] = [n + c for n, c in zip(self.lengths[first:], counts)]

    def compaction(self, keep: list[int]) -> list[int]:
        """The order the kept rows take (new row i = old row ``order[i]``): rows after the last
        kept place fill the holes, so rows that stay in place are not copied."""
        kept = set(keep)
        holes = [i for i in range(len(keep)) if i not in kept]
        movers = [r for r in keep if r >= len(keep)]
        order = list(range(len(keep)))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        return order

    def keep(self, order: list[int]) -> None:
        """The batch becomes old rows ``order``, in that order; slots after them fall idle."""
        moved = [(new, old) for new, old in enumerate(order) if new != old]
        if moved:
            new, old = (upload(x, self.device) for x in zip(*moved))
            span = max(self.lengths[o] for _, o in moved)
            self.keys[:, new, :, :span] = self.keys[:, old, :, :span]
            self.values[:, new, :, :span] = self.values[:, old, :, :span]
            self.lens[new] = self.lens[old]
        self.lens[len(order):self.rows] = 0  # idle slots write their column 0 and read nothing
        self.lengths = [self.lengths[o] for o in order]

    # -- a decode step -------------------------------------------------------------------------
    def reserve(self) -> None:
        """Make room for the step's next columns of every running row."""
        width = self.step_width if self.chunk else 1
        if self.rows and max(self.lengths) + width > self.columns:
            self._grow(max(2 * self.columns, max(self.lengths) + width))

    def positions(self) -> torch.Tensor:
        """Each stepped row's next position [step_rows, 1]: a view of ``lens``; for a prefill
        chunk, each of its tokens' [step_rows, step_width] (a token's position is its column)."""
        if self.chunk:
            return self.lens[self.step_first:self.step_first + self.step_rows, None] + self._columns[: self.step_width]
        return self.lens[: self.step_rows, None]

    def banned(self, kv_heads: int) -> torch.Tensor:
        """The step's attention mask (``attention.attend``'s): columns past each row's next token.
        Called once a step, before the writes: it also places them. For a prefill chunk,
        [rows, width, window]: True where a token may not look (columns after its own)."""
        if self.chunk:
            rows = self._rows[self.step_first:self.step_first + self.step_rows]
            at = self.positions()  # [rows, width]: each token's column
            self._write_at = (rows[:, None, None], self._heads[None, :, None], at[:, None, :])
            return self._columns[None, None, : self.window] > at[:, :, None]
        lens = self.lens[: self.step_rows]
        # (slot, head, column) of each row's next key in a layer's buffer: views that broadcast to [rows, H]
        self._write_at = (self._rows[: self.step_rows, None], self._heads[None, :], lens[:, None])
        allowed = self._columns[None, : self.window] <= lens[:, None]
        return banned_columns(allowed, kv_heads)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put each stepped row's new keys and values (``[rows, H, width, D]``) at its own next
        columns (one ``index_put_`` each, which reads them where they lie in the step's q/k/v
        output: no copy first); return the step's window of the layer (views)."""
        self.keys[layer].index_put_(self._write_at, k if self.chunk else k[:, :, 0])
        self.values[layer].index_put_(self._write_at, v if self.chunk else v[:, :, 0])
        first = self.step_first if self.chunk else 0
        rows = slice(first, first + self.step_rows)
        return self.keys[layer, rows, :, : self.window], self.values[layer, rows, :, : self.window]

    def advance(self) -> None:
        """Account for a decode step that added one token to every running row."""
        self.lens[: self.rows] += 1
        self.lengths = [n + 1 for n in self.lengths]

    # -- reading rows back (the prefix cache) --------------------------------------------------
    def length(self, row: int) -> int:
        return self.lengths[row]

    def row(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``i``'s keys and values ``[layers, H, tokens, D]`` (copies: one kernel each; indexed
        by layer, they read as the per-layer lists the prefix cache holds)."""
        n = self.lengths[i]
        return self.keys[:, i, :, :n].clone(), self.values[:, i, :, :n].clone()

    # -- buffers -------------------------------------------------------------------------------
    def _allocate(self, layers: int, heads: int, dim: int, dtype: torch.dtype, columns: int) -> None:
        # zeros, not empty: masked columns still meet the values in attention, and 0 * NaN = NaN
        shape = (layers, self.slots, heads, columns, dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=self.device)
        self.values = torch.zeros(shape, dtype=dtype, device=self.device)
        self._columns = torch.arange(columns, device=self.device)
        self._heads = torch.arange(heads, device=self.device)
        self.generation = next(_GENERATIONS)  # unique across instances: graphs key on it

    def _grow(self, columns: int) -> None:
        old_k, old_v = self.keys, self.values
        layers, _, heads, have, dim = old_k.shape
        self._allocate(layers, heads, dim, old_k.dtype, columns)
        self.keys[:, :, :, :have] = old_k
        self.values[:, :, :, :have] = old_v
