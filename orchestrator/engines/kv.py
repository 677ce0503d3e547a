"""The key/value cache of a running batch whose sequences join and leave at different times.

Rows are left-padded to a common length; the attention mask marks real positions. A newcomer's
prefilled cache is padded (or the batch is) to the longer of the two and appended; a finished
row is dropped; columns that every row pads are trimmed away.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


class BatchKV:
    def __init__(self) -> None:
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: keys, values [B, H, T, D]
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # [B, T], 1 = a real token

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    def append(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        new = [(layer.keys, layer.values) for layer in cache.layers]
        if not self.layers:
            self.layers, self.mask = new, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        old = _pad_left(self.layers, self.mask, width)
        new = _pad_left(new, mask, width)
        self.layers = [(torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]])) for a, b in zip(old[0], new[0])]
        self.mask = torch.cat([old[1], new[1]])

    def keep(self, rows: list[int]) -> None:
        idx = torch.tensor(rows, dtype=torch.long)
        self.layers = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.layers]
        self.mask = self.mask.index_select(0, idx)
        self._trim()

    def cache(self) -> DynamicCache:
        return DynamicCache(ddp_cache_data=self.layers)

    def advance(self, cache: DynamicCache) -> None:
        """Take the cache back after a decode step that added one real token to every row."""
        self.layers = [(layer.keys, layer.values) for layer in cache.layers]
        self.mask = torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long)], dim=1)

    def positions(self) -> torch.Tensor:
        """The position id of each row's next token: how many real tokens it has so far."""
        return self.mask.sum(dim=1, keepdim=True)

    def _trim(self) -> None:
        if self.rows == 0:
            self.layers, self.mask = [], torch.zeros(0, 0, dtype=torch.long)
            return
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else self.mask.shape[1]
        if start:
            self.layers = [(k[:, :, start:], v[:, :, start:]) for k, v in self.layers]
            self.mask = self.mask[:, start:]


def _pad_left(layers, mask, width):
    pad = width - mask.shape[1]
    if pad == 0:
        return layers, mask
    return [(F.pad(k, (0, 0, pad, 0)), F.pad(v, (0, 0, pad, 0))) for k, v in layers], F.pad(mask, (pad, 0))
