"""The key/value cache of a running batch whose sequences join and leave at different times.

Rows are left-padded to a common length, so every row's next token goes to the same column;
the attention mask marks real positions. Keys and values live in preallocated buffers
``[rows_capacity, heads, columns_capacity, head_dim]`` per layer, holding data in columns
``[start, end)``: a decode step writes one column in place instead of concatenating the whole
cache (which cost ~40% of a decode step). Capacity grows by doubling, so reallocations are rare.
A newcomer's prefilled cache is copied into free rows, right-aligned at ``end``; a finished row is
dropped by moving the kept rows up; columns that every row pads are skipped by moving ``start``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from .attention import banned_columns

_MIN_COLUMNS = 64  # headroom added on growth, so short runs never reallocate


class BatchKV:
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.keys: list[torch.Tensor] = []  # per layer [R, H, C, D]
        self.values: list[torch.Tensor] = []
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [rows, end - start], 1 = a real token
        self.start = self.end = 0

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def width(self) -> int:
        return self.end - self.start

    def append(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Add prefilled rows (their cache ``[n, H, L, D]`` per layer, left-padded as ``mask``)."""
        new = [(layer.keys, layer.values) for layer in cache.layers]
        n, length = mask.shape
        if not self.keys:
            self._allocate(new[0][0], layers=len(new), rows=n, left=length, columns=2 * length + _MIN_COLUMNS)
        rows, width = self.rows, max(self.width, length)
        if self.keys[0].shape[0] < rows + n or self.end - width < 0:
            self._relayout(rows=rows + n, left=width - self.width + _MIN_COLUMNS)
        # Columns newly in the window hold zeros or stale finite keys and values: masked, so unread.
        self.start = self.end - width
        for (k, v), kb, vb in zip(new, self.keys, self.values):
            kb[rows:rows + n, :, self.end - length:self.end] = k
            vb[rows:rows + n, :, self.end - length:self.end] = v
        self.mask = torch.cat([F.pad(self.mask, (width - self.mask.shape[1], 0)), F.pad(mask, (width - length, 0))])

    def compaction(self, keep: list[int]) -> list[int]:
        """The order the kept rows take: theirs (every kept row moves up past the ones that left)."""
        return keep

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); the batch shrinks to them."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        if rows != list(range(len(rows))):
            for buf in self.keys + self.values:
                buf[: len(rows), :, self.start:self.end] = buf[:, :, self.start:self.end].index_select(0, idx)
        self.mask = self.mask.index_select(0, idx)
        self._trim()

    def cache(self) -> Cache:
        """A transformers cache whose layers write the next column of this batch in place."""
        self.reserve()
        return Cache(layers=[_ColumnLayer(self, i) for i in range(len(self.keys))])

    def reserve(self) -> None:
        """Make room for the next column (before a decode step writes it)."""
        if self.end == self.keys[0].shape[2]:
            self._relayout(rows=self.rows, left=0)

    def advance(self) -> None:
        """Account for a decode step that added one real token to every row."""
        self.end += 1
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)

    def banned(self, kv_heads: int) -> torch.Tensor:
        """A decode step's attention mask (``attention.attend``'s): the padding, not the new column."""
        return banned_columns(F.pad(self.mask, (0, 1), value=1).bool(), kv_heads)

    def length(self, row: int) -> int:
        """Tokens that row ``row`` holds keys and values for."""
        return int(self.mask[row].sum())

    def positions(self) -> torch.Tensor:
        """The position id of each row's next token: how many real tokens it has so far."""
        return self.mask.sum(dim=1, keepdim=True)

    def view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The live keys and values of ``layer``: ``[rows, H, width, D]`` views of the buffers."""
        return (self.keys[layer][: self.rows, :, self.start:self.end],
                self.values[layer][: self.rows, :, self.start:self.end])

    def row(self, i: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Row ``i``'s keys and values at its real positions, per layer ``[H, tokens, D]`` (copies)."""
        cols = self.mask[i].nonzero().squeeze(-1) + self.start
        return ([k[i].index_select(1, cols) for k in self.keys], [v[i].index_select(1, cols) for v in self.values])

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put ``k``/``v`` [rows, H, n, D] in the columns after ``end``; the live window up to them (views)."""
        end = self.end + k.shape[2]
        self.keys[layer][: self.rows, :, self.end:end] = k
        self.values[layer][: self.rows, :, self.end:end] = v
        return (self.keys[layer][: self.rows, :, self.start:end],
                self.values[layer][: self.rows, :, self.start:end])

    def _allocate(self, like: torch.Tensor, layers: int, rows: int, left: int, columns: int) -> None:
        _, heads, _, dim = like.shape
        # zeros, not empty: masked columns still meet the values in attention, and 0 * NaN = NaN
        self.keys = [like.new_zeros(rows, heads, columns, dim) for _ in range(layers)]
        self.values = [like.new_zeros(rows, heads, columns, dim) for _ in range(layers)]
        self.start = self.end = left

    def _relayout(self, rows: int, left: int) -> None:
        """Copy the live window into new buffers with room for ``rows`` rows and ``left`` columns before it."""
        old_k, old_v, start, width, n = self.keys, self.values, self.start, self.width, self.rows
        have = old_k[0].shape[0]
        self._allocate(old_k[0], layers=len(old_k), rows=have if rows <= have else max(rows, 2 * have),
                       left=left, columns=max(2 * (left + width), left + width + _MIN_COLUMNS))
        for src, dst in zip(old_k + old_v, self.keys + self.values):
            dst[:n, :, left:left + width] = src[:n, :, start:start + width]
        self.end = left + width

    def _trim(self) -> None:
        if self.rows == 0:
            self.__init__(self.device)
            return
        used = self.mask.any(dim=0).nonzero()
        skip = int(used[0]) if len(used) else self.mask.shape[1]
        if skip:
            self.start += skip
            self.mask = self.mask[:, skip:]


class _ColumnLayer(DynamicLayer):
    """One model layer's window into a :class:`BatchKV` (what transformers' attention calls)."""

    def __init__(self, kv: BatchKV, index: int):
        super().__init__()
        self.kv, self.index = kv, index
        self.is_initialized = True
        self.keys, self.values = kv.view(index)

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys, self.values = self.kv.write(self.index, key_states, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.kv.width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.kv.width + query_length, 0
