"""The training passes' prefix tree (orchestrator/training/prefix_tree.py): every sequence is
recovered from its path, each distinct prefix is one node, and the tree's hidden states equal
each sequence's own forward pass. Logprobs and gradients through the client: test_losses.py."""
from __future__ import annotations

import random

import pytest
import torch
from orchestrator.training.prefix_tree import build, hidden_states


def check(seqs: list[list[int]], recompute: int) -> None:
    tree = build(seqs, recompute=recompute)
    for seq, path in zip(seqs, tree.paths):
        assert [t for seg, n in path for t in tree.segments[seg].tokens[:n]] == seq
        at = 0
        for k, (seg, n) in enumerate(path):
            s = tree.segments[seg]
            assert (s.start, s.depth, s.parent) == (at, k, path[k - 1][0] if k else -1)
            assert k == len(path) - 1 or n == len(s.tokens)  # only the last segment may be cut short
            at += n
    distinct = len({tuple(s[:i + 1]) for s in seqs for i in range(len(s))})
    if recompute == 0:
        assert tree.tokens == distinct  # each prefix once
    else:
        assert distinct <= tree.tokens <= sum(map(len, seqs))


def test_paths_spell_every_sequence_and_each_prefix_is_one_node():
    for recompute in (0, 3, 32):
        check([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3], [1, 2, 3, 4], [5], [1, 2, 3, 4, 6, 7], [1, 8]], recompute)
        rng = random.Random(recompute)
        for _ in range(500):
            check([[rng.randint(0, 3) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 6))], recompute)


def test_short_branching_segments_fold_into_their_branches():
    opening = list(range(100, 140))
    seqs = [[1, 2] + opening + [7, 8], [1, 2] + opening + [9], [1, 3, 4]]
    exact = build(seqs, recompute=0)
    assert [s.tokens for s in exact.segments if s.depth == 0] == [[1]]  # shared by all three, one token long
    folded = build(seqs, recompute=2)
    assert sorted(len(s.tokens) for s in folded.segments if s.depth == 0) == [3, 42]  # [1] folded into both branches
    assert folded.tokens == exact.tokens + 1 and max(s.depth for s in folded.segments) == 1  # the opening stays shared


def test_without_sharing_every_sequence_is_its_own_root():
    tree = build([[1, 2, 3], [1, 2, 4]], share=False)
    assert [s.tokens for s in tree.segments] == [[1, 2, 3], [1, 2, 4]] and tree.paths == [[(0, 3)], [(1, 3)]]


@pytest.fixture(scope="module")
def body():
    from orchestrator.models import load_model

    return load_model("tiny", dtype="float32").model.model


def test_hidden_states_equal_each_sequences_own_pass(body):
    rng = random.Random(1)
    opening = [rng.randint(10, 900) for _ in range(20)]
    seqs = [opening + [rng.randint(10, 900) for _ in range(n)] for n in (1, 9, 30, 30)]
    seqs[3][:35] = seqs[2][:35]  # a later branch point
    seqs.append(seqs[1][:25])  # a prefix of another
    seqs.append([rng.randint(10, 900) for _ in range(12)])  # shares nothing
    tree = build(seqs)
    assert tree.tokens < sum(map(len, seqs))
    with torch.no_grad():
        flat = hidden_states(body, tree, torch.device("cpu"))
        alone = torch.cat([body(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])
    assert flat.shape == alone.shape
    torch.testing.assert_close(flat, alone, atol=1e-4, rtol=1e-4)
