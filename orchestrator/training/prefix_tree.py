"""The training forward over a micro-batch's sequences as a prefix tree: each shared opening once.

A step's datums repeat each other. A GRPO group's episodes open with the same prompt; a game
role that re-renders its history every turn sends, in every episode, prompts that agree up to the
first move that differed (a Rock-Paper-Scissors step of 96 datums holds 14,280 tokens and 2,474
distinct prefixes). Hidden states, keys and values at a position depend only on the tokens up to
it, so positions that agree on their whole prefix are the same computation: the tree computes
each once, and backward sums its gradient over every sequence through it. Exact, not an
approximation: only the summation order differs from running each sequence alone.

The tree's chains (``Segment``: a run of tokens between branch points) are computed in waves by
depth. A segment's pass holds the keys and values of its whole path (its past, then its own);
its children attend to them as a cache (left-padded), so attention never spans more than one
sequence's length, and each wave is batched by similar segment length (``length_batches``).
Pasts and outputs are gathered a pass at a time, never a row at a time: on a GPU each op costs
its launch whatever its size, and per-row slices, pads and concatenations (and their backward)
once made up half the ops of a GRPO step's training pass (51,878 -> 25,958 for 8 prompts x 8
completions on a 30-layer model).

Sequences may carry keys (the adapter each one trains): only sequences with the same key share
segments, since the same tokens under two adapters are two computations. A wave then holds
several adapters' segments side by side, and ``hidden_states`` tells the caller which before
each pass (``route``), so one forward serves every adapter in it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Hashable, Sequence

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..models import kv_cache_name
from ..padding import length_batches
from ..upload import upload

# A forward pass costs a fixed ~0.2 s on a 2-core CPU besides its tokens: a short segment that
# branches is cheaper recomputed in each branch than given a wave of its own, when that repeats
# at most this many tokens in all (a GPU's passes cost far more: ServiceClient.pass_tokens).
RECOMPUTE_TOKENS = 32


@dataclass(eq=False)
class Segment:
    tokens: list[int]
    parent: int  # index of the parent segment; -1 at a root
    start: int  # position of its first token: the length of its path before it
    depth: int  # segments on the path before it
    key: Hashable = None  # the key of the sequences through it
    children: dict[int, int] = field(default_factory=dict)  # first token -> segment


@dataclass
class PrefixTree:
    segments: list[Segment]
    paths: list[list[tuple[int, int]]]  # per sequence: (segment, tokens taken from it), in order

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.segments)


def build(sequences: Sequence[Sequence[int]], share: bool = True, recompute: int = RECOMPUTE_TOKENS,
          keys: Sequence[Hashable] | None = None) -> PrefixTree:
    """The tree of ``sequences``; with ``share=False`` every sequence is a root of its own (the
    plain batch, for comparison). Segments whose branches would repeat at most ``recompute``
    tokens in all are folded into their branches (0: each distinct prefix exactly once).
    ``keys`` (one per sequence): only sequences with equal keys share segments."""
    keys = list(keys) if keys is not None else [None] * len(sequences)
    if not share:
        return PrefixTree([Segment(list(seq), -1, 0, 0, key) for seq, key in zip(sequences, keys)],
                          [[(i, len(seq))] for i, seq in enumerate(sequences)])
    segments: list[Segment] = []
    roots: dict[tuple[Hashable, int], int] = {}  # (key, first token) -> root; below a root, first token -> child
    for seq, key in zip(sequences, keys):
        seq, at, parent = list(seq), 0, -1
        while at < len(seq):
            siblings, edge = (roots, (key, seq[at])) if parent < 0 else (segments[parent].children, seq[at])
            index = siblings.get(edge)
            if index is None:  # a new branch: the rest of the sequence is one segment
                depth = segments[parent].depth + 1 if parent >= 0 else 0
                segments.append(Segment(seq[at:], parent, at, depth, key))
                siblings[edge] = len(segments) - 1
                break
            n = common_prefix(segments[index].tokens, seq[at:])
            if n < len(segments[index].tokens) and at + n < len(seq):  # it diverges inside: split there
                _split(segments, index, n)
            at, parent = at + n, index
    paths = [_path(segments, roots, seq, key) for seq, key in zip(sequences, keys)]
    return _fold_short(segments, paths, recompute)


def _path(segments: list[Segment], roots: dict, seq: Sequence[int], key: Hashable) -> list[tuple[int, int]]:
    """(segment, tokens taken) along ``seq``'s way through the finished tree."""
    path, at = [], 0
    while at < len(seq):
        index = segments[path[-1][0]].children[seq[at]] if path else roots[(key, seq[at])]
        n = min(len(segments[index].tokens), len(seq) - at)
        path.append((index, n))
        at += n
    return path


def _fold_short(segments: list[Segment], paths: list[list[tuple[int, int]]], recompute: int) -> PrefixTree:
    """Fold each segment whose children would repeat it at most ``recompute`` tokens in all into
    its children (parents first, so a chain of short ones folds all the way down), then drop it."""
    children: dict[int, list[int]] = {}
    for i, s in enumerate(segments):
        children.setdefault(s.parent, []).append(i)
    heir: dict[int, int] = {}  # folded segment -> a child that now starts with its tokens
    for i in sorted(range(len(segments)), key=lambda i: segments[i].depth):
        kids, s = children.get(i, []), segments[i]
        if not kids or (len(kids) - 1) * len(s.tokens) > recompute:
            continue
        for c in kids:
            segments[c].tokens = s.tokens + segments[c].tokens
            segments[c].start, segments[c].parent = s.start, s.parent
        siblings = children[s.parent]
        siblings[siblings.index(i):siblings.index(i) + 1] = kids
        heir[i], stack = kids[0], list(kids)
        while stack:  # the subtree moves up a level
            d = stack.pop()
            segments[d].depth -= 1
            stack += children.get(d, [])
    alive = [i for i in range(len(segments)) if i not in heir]
    index = {old: new for new, old in enumerate(alive)}
    out = []
    for path in paths:
        folded, carry = [], 0
        for seg, n in path:  # a folded segment's tokens now open the next one on the path
            if seg in heir:
                carry += n
            else:
                folded.append((index[seg], carry + n))
                carry = 0
        if carry:  # the sequence ended inside folded segments: any heir holds those positions
            seg = path[-1][0]
            while seg in heir:
                seg = heir[seg]
            folded.append((index[seg], carry))
        out.append(folded)
    kept = [segments[i] for i in alive]
    for s in kept:
        s.parent, s.children = index[s.parent] if s.parent >= 0 else -1, {}
    return PrefixTree(kept, out)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def _split(segments: list[Segment], index: int, n: int) -> None:
    """Cut segment ``index`` after ``n`` tokens; its tail becomes its only child."""
    seg = segments[index]
    tail = Segment(seg.tokens[n:], index, seg.start + n, seg.depth + 1, seg.key, seg.children)
    segments.append(tail)
    for child in tail.children.values():
        segments[child].parent = len(segments) - 1
    _deepen(segments, len(segments) - 1)
    seg.tokens, seg.children = seg.tokens[:n], {tail.tokens[0]: len(segments) - 1}


def _deepen(segments: list[Segment], index: int) -> None:
    for child in segments[index].children.values():
        segments[child].depth = segments[index].depth + 1
        _deepen(segments, child)


def hidden_states(body: torch.nn.Module, tree: PrefixTree, device: torch.device, pad_id: int = 0,
                  route: Callable[[list[Hashable]], None] | None = None) -> torch.Tensor:
    """The last hidden states of every sequence's every position, sequences one after another:
    ``[sum of lengths, d]``. ``body`` is the transformer without its LM head. ``route``, where
    given, is called before each forward with the keys of its rows, in order."""
    segs = tree.segments
    passes: list[_Pass] = []
    where: list[tuple[int, int]] = [(-1, -1)] * len(segs)  # segment -> (its pass, its row there)
    parents = {s.parent for s in segs}  # the segments others continue: their passes keep keys and values
    for depth in range(max(s.depth for s in segs) + 1):
        wave = [i for i, s in enumerate(segs) if s.depth == depth]
        for batch in length_batches([len(segs[i].tokens) for i in wave]):
            # rows whose parents share a pass sit together: their past is one gather per layer
            rows = sorted((wave[k] for k in batch), key=lambda i: where[segs[i].parent][0] if segs[i].parent >= 0 else -1)
            if route is not None:
                route([segs[i].key for i in rows])
            passes.append(_forward(body, segs, rows, passes, where, device, pad_id, parents))
            for r, i in enumerate(rows):
                where[i] = (len(passes) - 1, r)
    # Every sequence's positions in one gather from all passes' outputs: a slice per segment and a
    # cat would give backward a zero-filled copy of a pass's output per segment, and an add for each.
    offsets, at = [], 0
    for p in passes:
        offsets.append(at)
        at += p.hidden.shape[0] * p.hidden.shape[1]
    index: list[int] = []
    for path in tree.paths:
        for seg, n in path:
            p, r = where[seg]
            first = offsets[p] + r * passes[p].hidden.shape[1]
            index.extend(range(first, first + n))
    flat = torch.cat([p.hidden.flatten(0, 1) for p in passes]) if len(passes) > 1 else passes[0].hidden.flatten(0, 1)
    return flat.index_select(0, upload(index, flat.device))


@dataclass
class _Pass:
    hidden: torch.Tensor  # [rows, width, d]: its segments' last hidden states, right-padded
    cached: int  # columns of past before its segments' own
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, keys and values [rows, heads, cached + width, dim]; [] if no row is a parent


def _forward(body, segs: list[Segment], rows: list[int], passes: list[_Pass], where: list[tuple[int, int]], device,
             pad_id: int, parents: set[int]) -> _Pass:
    """One pass over segments ``rows``: their tokens, attending to their paths' keys and values.

    The paths' keys and values are left-padded and the segments right-padded, so a padding
    query still sees its row's tokens (a query that sees nothing gives NaN in some kernels)."""
    # Built in numpy, not Python lists: the host's time here comes before the pass's first kernel.
    lengths = np.array([len(segs[i].tokens) for i in rows])
    starts = np.array([segs[i].start for i in rows])
    width, cached = int(lengths.max()), int(starts.max())
    own = np.arange(width) < lengths[:, None]  # a row's own tokens, then right padding
    ids = np.full(own.shape, pad_id, dtype=np.int64)
    ids[own] = np.fromiter(chain.from_iterable(segs[i].tokens for i in rows), np.int64, int(lengths.sum()))
    positions = np.where(own, starts[:, None] + np.arange(width), 0)
    seen = np.arange(cached) >= (cached - starts)[:, None]  # its path's columns, left-padded
    mask = np.concatenate([seen, own], axis=1).astype(np.int64)
    past = _past(segs, rows, passes, where, cached, device) if cached else None
    cache = kv_cache_name(body)
    # A pass of leaves only (every pass without shared prefixes) keeps no keys and values: its
    # cache would copy each layer's for nothing.
    keep = any(i in parents for i in rows)
    # Rows of one length with no past need neither mask nor positions (0, 1, ... is the default):
    # given, transformers reads them back from the GPU (a wait) to find the mask all ones and the
    # positions one sequence a row.
    given = {} if cached == 0 and own.all() else {"attention_mask": upload(mask, device), "position_ids": upload(positions, device)}
    out = body(input_ids=upload(ids, device), use_cache=keep or past is not None, **{cache: past}, **given)
    layers = [(layer.keys, layer.values) for layer in getattr(out, cache).layers] if keep else []
    return _Pass(out.last_hidden_state, cached, layers)


def _past(segs: list[Segment], rows: list[int], passes: list[_Pass], where: list[tuple[int, int]], cached: int,
          device) -> DynamicCache:
    """The rows' paths' keys and values, left-padded to ``cached`` columns, as a cache.

    A parent's pass already holds its whole path: its own past, then its tokens. So a row's past
    is one run of columns of its parent's row there, ending where the parent's tokens end; the
    columns before the run (the left padding) are whatever lies there, never attended to (the
    mask), so they take no gradient either. Rows are grouped by their parents' pass: one gather
    per group and layer."""
    groups: dict[int, tuple[list[int], list[list[int]]]] = {}
    for i in rows:
        parent = segs[segs[i].parent]
        p, r = where[segs[i].parent]
        end = passes[p].cached + len(parent.tokens)  # the parent's last column, plus one
        sources, columns = groups.setdefault(p, ([], []))
        sources.append(r)
        columns.append([max(c, 0) for c in range(end - cached, end)])
    index = {p: (upload(src, device)[:, None], upload(cols, device))
             for p, (src, cols) in groups.items()}
    past = DynamicCache()
    for layer in range(len(passes[next(iter(groups))].layers)):
        kv = []
        for t in (0, 1):  # keys, values: [rows, heads, cached, dim] (advanced indices go first, hence the transpose)
            parts = [passes[p].layers[layer][t][src, :, cols].transpose(1, 2) for p, (src, cols) in index.items()]
            kv.append(torch.cat(parts) if len(parts) > 1 else parts[0])
        past.update(kv[0], kv[1], layer)
    return past
