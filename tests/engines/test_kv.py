"""BatchKV against a plain per-row reference: rows join with any prompt length, decode, leave."""
from __future__ import annotations

import random

import torch
from transformers import DynamicCache

from orchestrator.engines.kv import BatchKV

LAYERS, HEADS, DIM = 2, 3, 4


def _prefilled(lengths: list[int], gen: torch.Generator):
    """A left-padded prefill cache for rows of these lengths (padding holds junk), and per-row truth."""
    width = max(lengths)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    layers, truth = [], [[] for _ in lengths]
    for _ in range(LAYERS):
        k = torch.randn(len(lengths), HEADS, width, DIM, generator=gen)
        v = torch.randn(len(lengths), HEADS, width, DIM, generator=gen)
        layers.append((k, v))
        for i, n in enumerate(lengths):
            truth[i].append((k[i, :, width - n:], v[i, :, width - n:]))
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
    return DynamicCache(ddp_cache_data=layers), mask, truth


def _check(kv: BatchKV, truth: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> None:
    assert kv.rows == len(truth)
    assert kv.positions().squeeze(1).tolist() == [t[0][0].shape[1] for t in truth]
    for layer in range(LAYERS):
        keys, values = kv.view(layer)
        assert keys.shape[2] == kv.mask.shape[1]
        for row, per_layer in enumerate(truth):
            real = kv.mask[row].bool()
            assert torch.equal(keys[row][:, real], per_layer[layer][0])
            assert torch.equal(values[row][:, real], per_layer[layer][1])
    for row, per_layer in enumerate(truth):  # what the prefix cache takes of a finished row
        keys, values = kv.row(row)
        assert kv.length(row) == per_layer[0][0].shape[1]
        assert all(torch.equal(k, t[0]) and torch.equal(v, t[1]) for k, v, t in zip(keys, values, per_layer, strict=True))


def test_batch_kv_matches_per_row_reference_through_joins_decodes_and_leaves():
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    kv, truth = BatchKV(), []
    for step in range(400):
        if step % 25 == 0 or not truth:  # newcomers, sometimes far longer than the batch (relayout)
            lengths = [rng.randint(1, 30 if step < 200 else 250) for _ in range(rng.randint(1, 5))]
            cache, mask, new = _prefilled(lengths, gen)
            kv.append(cache, mask)
            truth += new
        elif step % 11 == 0:  # some rows finish; the rest are reordered
            keep = rng.sample(range(len(truth)), k=rng.randint(0, len(truth)))
            kv.keep(keep)
            truth = [truth[i] for i in keep]
            if not truth:
                assert kv.rows == 0
                continue
        else:  # a decode step: each layer writes one column through the transformers cache
            cache = kv.cache()
            assert cache.get_seq_length() == kv.mask.shape[1]
            for layer in range(LAYERS):
                k = torch.randn(len(truth), HEADS, 1, DIM, generator=gen)
                v = torch.randn(len(truth), HEADS, 1, DIM, generator=gen)
                keys, values = cache.layers[layer].update(k, v)
                assert keys.shape[2] == kv.mask.shape[1] + 1  # what attention sees: the past and the new column
                for row in range(len(truth)):
                    pk, pv = truth[row][layer]
                    truth[row][layer] = (torch.cat([pk, k[row]], 1), torch.cat([pv, v[row]], 1))
            kv.advance()
        _check(kv, truth)


def test_columns_no_row_uses_are_trimmed_and_an_empty_batch_frees_its_buffers():
    gen = torch.Generator().manual_seed(1)
    kv = BatchKV()
    cache, mask, _ = _prefilled([40, 3], gen)
    kv.append(cache, mask)
    assert kv.mask.shape[1] == 40
    kv.keep([1])  # the long row leaves: only the short one's 3 columns remain in the window
    assert kv.mask.shape[1] == 3 and kv.width == 3
    kv.keep([])
    assert kv.rows == 0 and kv.keys == []


def test_decoding_past_the_buffer_grows_it_and_keeps_every_column():
    gen = torch.Generator().manual_seed(2)
    kv = BatchKV()
    cache, mask, truth = _prefilled([2, 5], gen)
    kv.append(cache, mask)
    capacity, buffer, moves = kv.keys[0].shape[2], kv.keys[0].data_ptr(), 0
    for _ in range(3 * capacity):
        cache = kv.cache()
        for layer in range(LAYERS):
            k, v = torch.randn(2, HEADS, 1, DIM, generator=gen), torch.randn(2, HEADS, 1, DIM, generator=gen)
            cache.layers[layer].update(k, v)
            for row in range(2):
                pk, pv = truth[row][layer]
                truth[row][layer] = (torch.cat([pk, k[row]], 1), torch.cat([pv, v[row]], 1))
        kv.advance()
        moves, buffer = moves + (kv.keys[0].data_ptr() != buffer), kv.keys[0].data_ptr()
    assert kv.keys[0].shape[2] > 3 * capacity
    assert moves <= 3  # capacity doubles: a few reallocations over 3x the columns, not one every step or two
    _check(kv, truth)


def test_a_newcomer_as_long_as_the_columns_before_end_fits_and_one_longer_moves_them():
    """A newcomer's cache is right-aligned at ``end``: ``end`` columns of room before it fit it in
    place, one more column needs the buffers laid out again (one past wrote from column -1)."""
    gen = torch.Generator().manual_seed(3)
    kv = BatchKV()
    cache, mask, truth = _prefilled([5, 5, 5], gen)
    kv.append(cache, mask)
    kv.keep([0])  # rows to spare: only the newcomers' lengths decide
    truth = truth[:1]
    for length in (kv.end, kv.end + 1):
        cache, mask, new = _prefilled([length], gen)
        kv.append(cache, mask)
        truth += new
        _check(kv, truth)
