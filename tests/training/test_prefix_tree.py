"""The training passes' prefix tree (orchestrator/training/prefix_tree.py): every sequence is
recovered from its path, each distinct prefix is one node, and the tree's hidden states equal
each sequence's own forward pass. Logprobs and gradients through the client: test_losses.py."""
from __future__ import annotations

import random

import pytest
import torch
from orchestrator.training.prefix_tree import build, hidden_states


def check(seqs: list[list[int]]) -> None:
    tree = build(seqs)
    for seq, path in zip(seqs, tree.paths):
        assert [t for seg, n in path for t in tree.segments[seg].tokens[:n]] == seq
        at = 0
        for k, (seg, n) in enumerate(path):
            s = tree.segments[seg]
            assert (s.start, s.depth, s.parent) == (at, k, path[k - 1][0] if k else -1)
            assert k == len(path) - 1 or n == len(s.tokens)  # only the last segment may be cut short
            at += n
    assert tree.tokens == len({tuple(s[:i + 1]) for s in seqs for i in range(len(s))})  # each prefix once


def test_paths_spell_every_sequence_and_each_prefix_is_one_node():
    check([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3], [1, 2, 3, 4], [5], [1, 2, 3, 4, 6, 7], [1, 8]])
    rng = random.Random(0)
    for _ in range(500):
        check([[rng.randint(0, 3) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 6))])


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
