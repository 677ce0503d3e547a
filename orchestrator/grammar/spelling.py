"""The tokenizer's own spellings of a small finite language, as a token trie.

A grammar mask allows every token sequence that spells a valid text: after ``{"move": "`` it
allows ``rock`` and also ``r``, ``o``, ``ck``. Sampling then spreads a value's probability over
many paths (docs/constrained.md measured 57 of 96 game moves spelled in pieces), an update raises
one path rather than the value, and replies take more steps. Where a schema (after its reply
prefix) admits only a few texts, enums and constants, ``Spellings`` holds the tokenizer's
spelling of each, and the engine and the training replay both cut the grammar's mask down to
the trie's next tokens, so the policy samples and trains one path per value.
"""
from __future__ import annotations

import torch

MAX_TEXTS = 256  # more than this many texts: not a small language, leave the grammar alone
MAX_BRANCH = 32  # allowed next bytes at one point of the walk above which it gives up (free text)
MAX_NODES = 4096


class Spellings:
    """A trie of token sequences; node 0 is the root. ``stops`` (the end-of-turn tokens) may
    follow a node where a text is complete."""

    def __init__(self, sequences: list[list[int]], width: int, stops: list[int]):
        self.children: list[dict[int, int]] = [{}]  # node -> token -> child node
        self.complete: set[int] = set()
        for seq in sequences:
            node = 0
            for token in seq:
                node = self.children[node].setdefault(token, len(self.children))
                if node == len(self.children):
                    self.children.append({})
            self.complete.add(node)
        self.width, self.stops = width, stops
        self._masks: dict[int, torch.Tensor] = {}

    def step(self, node: int | None, token: int) -> int | None:
        """The node after ``token``; None once off the trie (a forced closing can leave it)."""
        return None if node is None else self.children[node].get(token)

    def restrict(self, node: int | None, row: torch.Tensor) -> None:
        """AND the grammar's mask ``row`` with the tokens that continue a spelling from ``node``
        (and the stops where a text is complete); off the trie, the grammar's mask as it is."""
        if node is None:
            return
        mask = self._masks.get(node)
        if mask is None:
            mask = torch.zeros(self.width, dtype=torch.int32)
            for token in [*self.children[node], *(self.stops if node in self.complete else ())]:
                mask[token // 32] |= _bit(token % 32)
            self._masks[node] = mask
        row &= mask.to(row.device)


def _bit(k: int) -> int:
    return -(1 << 31) if k == 31 else 1 << k  # int32: bit 31 is the sign
