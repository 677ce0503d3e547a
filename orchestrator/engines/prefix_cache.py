"""Keys and values of finished sequences, kept so later prompts that start the same way skip them.

Multi-turn episodes send prompts that extend earlier ones: a conversation role's next turn is its
last prompt + its reply + a short new message (``tokens.continuation_ids``), and every episode of
a recipe opens with the same instructions. Prefilling those again was most of a Guess the Number
rollout. When a sequence finishes, the engine stores its KV cache here; a new request reuses a
stored prefix of its prompt and prefills only the rest.

Entries are found by hashing 16-token blocks in a chain (as vLLM's prefix cache does): the
longest run of whole blocks any entry shares with the prompt, then token by token as far as the
most recent of those entries goes on matching it (another of them might match up to 15 tokens
further: finding it would mean comparing every one, on each lookup). Keys include the adapter and its version: KV computed with other weights
is never reused, and an adapter's update drops its entries. Least recently used entries go first
once ``budget`` tokens are stored.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

BLOCK = 16


@dataclass(eq=False)
class Entry:
    key: tuple[str, int]  # (adapter, version)
    tokens: tuple[int, ...]
    # per layer [heads, len(tokens), head_dim]: a list, or one [layers, ...] tensor (slots.SlotKV.row)
    keys: list[torch.Tensor] | torch.Tensor
    values: list[torch.Tensor] | torch.Tensor
    hashes: list[int] = field(default_factory=list)  # chain hash of each full block


class PrefixCache:
    def __init__(self, budget: int):
        self.budget = budget  # tokens kept, over all entries
        self.size = 0
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # id -> entry, least recent first
        self._index: dict[tuple, dict[int, Entry]] = {}  # (key, chain hash) -> entries with that prefix

    def lookup(self, tokens: tuple[int, ...] | list[int], key: tuple[str, int]) -> tuple[int, Entry | None]:
        """(n, entry): the entry's first n tokens equal the prompt's, n <= len(tokens) - 1 (the
        prompt's last token must go through the model for its logits); (0, None) on a miss."""
        best, n, h = None, 0, 0
        for i, block in enumerate(_blocks(tokens)):
            h = hash((h, block))
            found = self._index.get((key, h))
            if not found:
                break
            best, n = next(reversed(found.values())), (i + 1) * BLOCK
        if best is None:
            return 0, None
        limit = min(len(best.tokens), len(tokens))
        while n < limit and best.tokens[n] == tokens[n]:
            n += 1
        n = min(n, len(tokens) - 1)
        if n < BLOCK or tuple(best.tokens[:n]) != tuple(tokens[:n]):  # too short to pay, or a hash collision
            return 0, None
        self._entries.move_to_end(id(best))
        return n, best

    def insert(self, tokens: list[int], key: tuple[str, int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        if len(tokens) < BLOCK or len(tokens) > self.budget:
            return
        n, covering = self.lookup(tokens + [-1], key)  # -1: lets a stored copy of all of `tokens` count
        if covering is not None and n == len(tokens):
            return  # already stored (as this or a longer sequence)
        if covering is not None and n == len(covering.tokens):
            self._remove(covering)  # the new sequence extends it: keep only the longer one
        entry = Entry(key, tuple(tokens), keys, values)
        h = 0
        for block in _blocks(tokens):
            h = hash((h, block))
            entry.hashes.append(h)
            self._index.setdefault((key, h), {})[id(entry)] = entry
        self._entries[id(entry)] = entry
        self.size += len(tokens)
        while self.size > self.budget:
            self._remove(next(iter(self._entries.values())))

    def drop(self, adapter: str) -> None:
        """Forget everything computed with ``adapter`` (its weights changed)."""
        for entry in [e for e in self._entries.values() if e.key[0] == adapter]:
            self._remove(entry)

    def _remove(self, entry: Entry) -> None:
        del self._entries[id(entry)]
        self.size -= len(entry.tokens)
        for h in entry.hashes:
            bucket = self._index.get((entry.key, h))
            if bucket is not None:
                bucket.pop(id(entry), None)
                if not bucket:
                    del self._index[(entry.key, h)]


def shared_prefixes(prompts: list[list[int]]) -> list[list[int]]:
    """The prefixes, of BLOCK tokens or more, that two or more of ``prompts`` share, shortest
    first: each pair of neighbours in sorted order shares its longest common prefix, so the
    distinct ones are the branch points of the prompts' trie. A prefix stops one token short of
    each prompt that has it, whose last token must still go through the model for its logits."""
    ordered = sorted(prompts)
    found: set[tuple[int, ...]] = set()
    for a, b in zip(ordered, ordered[1:]):
        n = 0
        limit = min(len(a), len(b)) - 1
        while n < limit and a[n] == b[n]:
            n += 1
        if n >= BLOCK:
            found.add(tuple(a[:n]))
    return [list(t) for t in sorted(found, key=len)]


def _blocks(tokens) -> list[tuple[int, ...]]:
    return [tuple(tokens[i:i + BLOCK]) for i in range(0, len(tokens) - BLOCK + 1, BLOCK)]
