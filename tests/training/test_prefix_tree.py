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
    for recompute in (2, 1):  # 1: its branches repeat it exactly that many tokens, "at most"
        folded = build(seqs, recompute=recompute)
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


@pytest.mark.parametrize("lengths", [(16, 16, 16), (16, 9, 16)])
def test_a_pass_of_rows_of_one_length_goes_without_mask_and_positions(body, lengths):
    """Only padding needs the mask and positions, which transformers would read back from a GPU; and
    a pass of leaves only keeps no keys and values (no row continues them)."""
    rng = random.Random(3)
    seqs = [[rng.randint(10, 900) for _ in range(n)] for n in lengths]
    given = []
    hook = body.register_forward_pre_hook(lambda _, args, kwargs: given.append(kwargs), with_kwargs=True)
    try:
        with torch.no_grad():
            flat = hidden_states(body, build(seqs, share=False), torch.device("cpu"))
    finally:
        hook.remove()
    alone = torch.cat([body(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])
    torch.testing.assert_close(flat, alone, atol=1e-4, rtol=1e-4)
    padded = len(set(lengths)) > 1
    assert [("attention_mask" in kw, "position_ids" in kw, kw["use_cache"]) for kw in given] == [(padded, padded, False)]


def _two_families(children: int, rng: random.Random) -> list[list[int]]:
    """Two openings far apart in length (so they take passes of their own), ``children``
    continuations of each, all branching at their first token."""
    seqs = []
    for opening in (40, 150):
        prefix = [rng.randint(10, 900) for _ in range(opening)]
        seqs += [prefix + [1000 + c] + [rng.randint(10, 900) for _ in range(11)] for c in range(children)]
    return seqs


@pytest.mark.parametrize("interleaved", [False, True])
def test_children_of_openings_from_different_passes_get_the_numbers_and_gradients_of_their_own_passes(body, interleaved):
    seqs = _two_families(3, random.Random(2))
    if interleaved:  # the children's wave alternates between the parents' passes: each past still its own parent's
        seqs = [s for pair in zip(seqs[:3], seqs[3:]) for s in pair]
    tree = build(seqs)
    assert len({s.start for s in tree.segments if s.depth == 1}) == 2  # two parent passes feed the children's pass
    weight = body.layers[0].self_attn.k_proj.weight
    flat = hidden_states(body, tree, torch.device("cpu"))
    (tree_grad,) = torch.autograd.grad(flat.square().sum(), weight)
    alone = torch.cat([body(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])
    (alone_grad,) = torch.autograd.grad(alone.square().sum(), weight)
    torch.testing.assert_close(flat, alone, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(tree_grad, alone_grad, atol=1e-4, rtol=1e-4)


def test_the_trees_own_work_does_not_grow_with_its_rows(body):
    """Past keys and values and the output are gathered a pass at a time, not a row at a time: on a
    GPU every op costs launch time whatever its size (a GRPO step's 64 completions once cost 26k
    ops this way)."""
    from orchestrator.engines.graphs import count_kernels

    def kernels(children: int) -> int:
        tree = build(_two_families(children, random.Random(3)))
        body.zero_grad(set_to_none=True)  # else a later backward adds into .grad where the first one set it
        return sum(count_kernels(lambda: hidden_states(body, tree, torch.device("cpu")).sum().backward()).values())

    assert kernels(2) == kernels(16)  # the tree's shape is the same: two openings, a pass of continuations
