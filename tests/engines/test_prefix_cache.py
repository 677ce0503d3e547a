"""The prefix cache: longest stored prefix, keyed by adapter version, bounded; prefixes that
newcomers share computed once; and the engine's outputs with reused prefixes equal those computed
from scratch."""
from __future__ import annotations

import asyncio

import pytest
import torch
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.engines.hf import HFEngine
from orchestrator.padding import length_batches
from orchestrator.engines.prefix_cache import BLOCK, PrefixCache, shared_prefixes
from orchestrator.messages import schema_json
from orchestrator.models import load_model

from support import generate_together, randomize, tiny_engine
from test_hf_engine import PROMPTS


def kv(n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [torch.arange(n, dtype=torch.float32).view(1, n, 1)], [-torch.arange(n, dtype=torch.float32).view(1, n, 1)]


def test_lookup_finds_the_longest_stored_prefix_and_leaves_the_last_token():
    cache = PrefixCache(budget=10_000)
    a = list(range(100))
    cache.insert(a[:40], ("base", 0), *kv(40))
    cache.insert(a[:70] + [999] * 10, ("base", 0), *kv(80))
    n, entry = cache.lookup(a, ("base", 0))
    assert n == 70 and entry.tokens[:70] == tuple(a[:70])
    assert cache.lookup(a[:40], ("base", 0))[0] == 39  # the prompt's last token is always computed
    assert cache.lookup(a[:BLOCK - 1] + [5] * 50, ("base", 0)) == (0, None)  # shorter than a block: not worth it
    assert cache.lookup(a, ("pro", 0)) == (0, None) and cache.lookup(a, ("base", 1)) == (0, None)


def test_an_extension_replaces_its_prefix_and_the_budget_evicts_the_least_recent():
    cache = PrefixCache(budget=100)
    first = list(range(40))
    cache.insert(first, ("pro", 1), *kv(40))
    cache.insert(first + list(range(500, 520)), ("pro", 1), *kv(60))  # a later turn of the same conversation
    assert cache.size == 60
    cache.insert(list(range(1000, 1030)), ("pro", 1), *kv(30))
    cache.lookup(first + [7], ("pro", 1))  # touch the conversation: the other entry is now the least recent
    cache.insert(list(range(2000, 2030)), ("pro", 1), *kv(30))
    assert cache.size == 90 and cache.lookup(list(range(1000, 1031)), ("pro", 1)) == (0, None)
    cache.drop("pro")
    assert cache.size == 0 and cache.lookup(first + [7], ("pro", 1)) == (0, None)



def test_a_sequence_is_stored_once_within_the_budget_and_one_over_it_is_not_stored():
    cache = PrefixCache(budget=64)
    opening = list(range(BLOCK))  # one block: the shortest sequence worth storing
    cache.insert(opening, ("base", 0), *kv(BLOCK))
    assert cache.lookup(opening + [7], ("base", 0))[0] == BLOCK
    cache.insert(opening, ("base", 0), *kv(BLOCK))  # stored already: as it is, or in a longer one
    cache.insert(list(range(100, 148)), ("base", 0), *kv(48))
    cache.insert(list(range(100, 132)), ("base", 0), *kv(32))
    assert cache.size == 64 and cache.lookup(opening + [7], ("base", 0))[0] == BLOCK  # a full budget evicts nothing
    cache.insert(list(range(200, 265)), ("base", 0), *kv(65))  # more than the whole budget: evicts nothing either
    assert cache.size == 64 and cache.lookup(list(range(100, 149)), ("base", 0))[0] == 48
    cache.drop("base")
    assert cache.size == 0 and not cache._index  # no empty buckets left behind


def test_a_hash_collision_is_no_hit(monkeypatch):
    from orchestrator.engines import prefix_cache

    monkeypatch.setattr(prefix_cache, "hash", lambda _: 0, raising=False)  # every chain of blocks collides
    cache = PrefixCache(budget=1000)
    cache.insert(list(range(40)), ("base", 0), *kv(40))
    assert cache.lookup(list(range(100, 140)), ("base", 0)) == (0, None)
    assert cache.lookup(list(range(40)) + [7], ("base", 0))[0] == 40

def test_shared_prefixes_are_the_branch_points_shortest_first():
    opening, alice, bob = list(range(100, 140)), list(range(200, 230)), list(range(300, 330))
    prompts = [opening + alice + [1], opening + bob + [2], opening + alice + [1], opening + alice + [3, 4],
               list(range(500, 600)), opening[:BLOCK - 1] + [9] * 40]
    # the seats' common instructions, then alice's opening (two identical prompts stop a token
    # short of their end, which is where her other prompt parts from them)
    assert shared_prefixes(prompts) == [opening, opening + alice]
    assert shared_prefixes([opening + [1]]) == [] and shared_prefixes([opening[:BLOCK] + [1], opening[:BLOCK] + [2]]) == [opening[:BLOCK]]
    assert shared_prefixes([opening[:BLOCK - 1] + [1], opening[:BLOCK - 1] + [2]]) == []  # under a block: not worth it


@pytest.fixture
def loaded():
    return load_model("tiny", dtype="float32", seed=0)


def prompt(engine, i) -> tuple[int, ...]:
    return tuple(engine.apply_chat_template(PROMPTS[i % len(PROMPTS)] * 3))  # long enough for a few blocks


def generate(engine, prompts, adapter=None, temperature=0.0):
    reqs = [GenerationRequest(p, SamplingParams(temperature=temperature, max_tokens=10, seed=7 + i), adapter)
            for i, p in enumerate(prompts)]
    return asyncio.run(_gather(engine, reqs))


async def _gather(engine, reqs):
    return await asyncio.gather(*(engine.generate(r) for r in reqs))


def close(engine):
    asyncio.run(engine.aclose())


@pytest.mark.parametrize("adapter", [None, "alpha"])
def test_reused_prefixes_give_the_outputs_of_a_full_prefill(loaded, adapter):
    cached, fresh = HFEngine(loaded), tiny_engine(prefix_cache_tokens=0)
    try:
        for e in (cached, fresh):
            e.add_adapter("alpha")
            randomize(e, "alpha", 1)
        first = generate(cached, [prompt(cached, 0)], adapter)[0]
        # a later turn that continues the first (its tokens and more), and an unrelated prompt, prefilled together
        later = prompt(cached, 0) + tuple(first.token_ids) + prompt(cached, 1)[:20]
        before = cached.stats.prefix_hit_tokens
        outs = generate(cached, [later, prompt(cached, 2)], adapter, temperature=0.8)
        assert cached.stats.prefix_hit_tokens - before >= len(prompt(cached, 0))
        refs = generate(fresh, [later, prompt(cached, 2)], adapter, temperature=0.8)
        assert fresh.stats.prefix_hit_tokens == 0
        assert_same_outputs(outs, refs)
    finally:
        close(cached)
        close(fresh)


def test_newcomers_that_open_alike_prefill_their_opening_once(loaded):
    shared, fresh = HFEngine(loaded), tiny_engine(prefix_cache_tokens=0)
    p = prompt(shared, 0)
    rows = [(p, "alpha"), (p, "alpha"), (p + (5, 6, 7), "alpha"), (p, None), (prompt(shared, 2), "alpha")]
    try:
        for e in (shared, fresh):
            e.add_adapter("alpha")
            randomize(e, "alpha", 1)
        outs = generate_together_at_08(shared, rows)
        # alpha's opening once (all but the last token), then each alpha row's rest from it; the
        # base row and the unrelated prompt in full
        assert shared.stats.prefix_hit_tokens == 3 * (len(p) - 1)
        assert shared.stats.prefill_tokens == (len(p) - 1) + (1 + 1 + 4) + len(p) + len(prompt(shared, 2))
        refs = generate_together_at_08(fresh, rows)
        assert_same_outputs(outs, refs)
    finally:
        close(shared)
        close(fresh)


def assert_same_outputs(outs, refs):
    for out, ref in zip(outs, refs):
        assert out.token_ids == ref.token_ids
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref.logprobs)) < 1e-4


def generate_together_at_08(engine, rows):
    """Sampled at temperature 0.8, all admitted by one scheduler iteration."""
    return generate_together(engine, [GenerationRequest(p, SamplingParams(temperature=0.8, max_tokens=10, seed=7 + i), adapter)
                                      for i, (p, adapter) in enumerate(rows)])


def test_an_opening_gets_a_pass_of_its_own_only_where_that_saves_more_than_a_pass(loaded):
    """``pass_tokens``: a pass's fixed cost in tokens (4,096 on a GPU, where a pass costs its
    launches). Two rows sharing an opening save its length once: at a cost above that, the rows
    prefill in full, in one pass, and sample what they would with the opening shared."""
    outs = {}
    for cost in (0, 10_000):
        engine = HFEngine(loaded, pass_tokens=cost)
        rows = [(prompt(engine, 0), None), (prompt(engine, 0) + (5, 6), None)]
        try:
            outs[cost] = generate_together_at_08(engine, rows)
            saved = len(rows[0][0]) - 1
            assert engine.stats.prefix_hit_tokens == (2 * saved if cost == 0 else 0)
            assert engine.stats.prefill_passes == (2 if cost == 0 else 1)
        finally:
            close(engine)
    assert_same_outputs(outs[0], outs[10_000])


def test_an_adapter_update_drops_its_cached_prefixes(loaded):
    engine = HFEngine(loaded)
    try:
        engine.add_adapter("alpha")
        randomize(engine, "alpha", 1)
        p = prompt(engine, 3)
        generate(engine, [p], "alpha")
        generate(engine, [p + (5, 6)], "alpha")
        hits = engine.stats.prefix_hit_tokens
        assert hits >= len(p) - 1
        randomize(engine, "alpha", 2)  # new weights: the old keys and values are wrong now
        assert engine._prefix.size == 0  # gone, not only out of reach of the new version's lookups
        generate(engine, [p + (5, 6, 7)], "alpha")
        assert engine.stats.prefix_hit_tokens == hits
    finally:
        close(engine)


def test_a_row_whose_adapter_changed_while_it_ran_is_not_remembered(loaded):
    """A row's keys from before an update and after it belong to neither version: remembered under
    the old one, no lookup finds them and they hold the cache's budget."""
    engine = HFEngine(loaded)
    engine.add_adapter("alpha")
    # long enough that it still runs when a loaded machine's event loop gets to it
    request = GenerationRequest(prompt(engine, 0), SamplingParams(max_tokens=256, ignore_eos=True, seed=0), "alpha")

    async def update_while_it_runs():
        running = asyncio.ensure_future(engine.generate(request))
        while not engine._active:
            await asyncio.sleep(0.001)
        with engine._lock:  # between two steps: the row's keys mix two sets of weights
            randomize(engine, "alpha", 1)
            assert engine._active  # still running
        return await running

    try:
        assert len(asyncio.run(update_while_it_runs()).token_ids) == 256
        assert engine._prefix.size == 0  # not kept under its old version, where no lookup finds it
    finally:
        close(engine)


@pytest.mark.parametrize("static", [False, True], ids=["batch-kv", "static"])
def test_a_reply_closed_by_force_is_not_reused_by_the_next_turn(loaded, static):
    """A forced closing takes the place of tokens whose keys and values the row holds (the static
    path has fed the sampled token it replaces): remembered, the next turn quoting the reply would
    reuse keys of tokens it does not hold."""
    cached, fresh = HFEngine(loaded, static=static), tiny_engine(prefix_cache_tokens=0)
    text = schema_json({"type": "object", "properties": {"argument": {"type": "string", "maxLength": 400}},
                        "required": ["argument"], "additionalProperties": False})
    try:
        p = prompt(cached, 0)
        reqs = [GenerationRequest(p, SamplingParams(temperature=1.0, max_tokens=12, seed=s), json_schema=text) for s in range(8)]
        outs = asyncio.run(_gather(cached, reqs))
        later = [p + tuple(o.token_ids) + prompt(cached, 1)[:20] for o in outs if o.forced_tokens]
        assert later, "a random model writes until the budget: its replies must have been closed by force"
        assert_same_outputs(generate(cached, later, temperature=0.8), generate(fresh, later, temperature=0.8))
    finally:
        close(cached)
        close(fresh)


def test_one_model_serves_one_open_engine_at_a_time(loaded):
    engine = HFEngine(loaded)
    with pytest.raises(ValueError, match="already serves an open engine"):
        HFEngine(loaded)
    close(engine)
    close(HFEngine(loaded))  # closed engines leave no hooks behind


def test_length_batches_keep_short_rests_apart_from_long_ones():
    # cache hits leave a few tokens each; two prompts missed the cache: a batch of their own
    assert length_batches([1, 300, 4, 290, 1]) == [[1, 3], [2, 0, 4]]
    assert length_batches([100, 60, 40, 10]) == [[0, 1, 2], [3]]  # within 64 tokens, or padding under a row's own length
    assert length_batches([]) == [] and length_batches([7]) == [[0]]
    assert length_batches([74, 10]) == [[0, 1]] and length_batches([75, 10]) == [[0], [1]]  # "more than" slack: 64 joins
    assert length_batches([300, 200]) == [[0, 1]]  # 100 padded tokens, past slack but under the row's own 200
