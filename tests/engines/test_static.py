"""The static decode path (the GPU's: slots.SlotKV, lora.SlotLoRA, graphs' buckets), run eagerly on
the CPU: it must sample what the CPU's BatchKV path samples. CUDA graphs themselves: tests/gpu."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.engines.graphs import CaptureRefused, StepGraphs, count_kernels, rows_bucket, window_bucket
from orchestrator.engines.hf import _STEP_PREFILL
from orchestrator.engines import slots
from orchestrator.engines.slots import SlotKV
from support import NO_ONEDNN, assert_same_draws, lora_state, randomize, tiny_engine

LAYERS, HEADS, DIM = 2, 3, 4


def _prefilled(runs: list[tuple[int, int]], gen: torch.Generator):
    """A prefill cache whose rows hold real tokens in up to two runs (a cached prefix, then the
    rest: the engine's layout), junk elsewhere; and each row's real keys and values per layer."""
    width = max(a + b for a, b in runs) + 3
    mask = torch.zeros(len(runs), width, dtype=torch.long)
    for i, (prefix, rest) in enumerate(runs):
        mask[i, 2:2 + prefix] = 1  # junk columns before, between and after the two runs
        mask[i, width - rest:] = 1
    layers, truth = [], [[] for _ in runs]
    for _ in range(LAYERS):
        k, v = torch.randn(len(runs), HEADS, width, DIM, generator=gen), torch.randn(len(runs), HEADS, width, DIM, generator=gen)
        layers.append((k, v))
        for i in range(len(runs)):
            real = mask[i].bool()
            truth[i].append((k[i][:, real], v[i][:, real]))
    return DynamicCache(ddp_cache_data=layers), mask, truth


@pytest.mark.parametrize("min_columns", [512, 16], ids=["roomy", "regrown"])
def test_slot_kv_matches_a_per_row_reference_through_joins_steps_and_leaves(min_columns, monkeypatch):
    """With buffers that start small, joins wider than them and steps past them regrow them."""
    monkeypatch.setattr(slots, "_MIN_COLUMNS", min_columns)
    gen, rng = torch.Generator().manual_seed(0), random.Random(0)
    kv, truth = SlotKV("cpu", slots=12), []
    for step in range(300):
        if (step % 20 == 0 or not truth) and len(truth) < 8:
            runs = [(rng.choice([0, 0, rng.randint(1, 9)]), rng.randint(1, 40 if step < 150 else 300))
                    for _ in range(rng.randint(1, 12 - len(truth)))]
            cache, mask, new = _prefilled(runs, gen)
            kv.append(cache, mask)
            truth += new
        elif step % 7 == 0:  # some rows finish: holes are filled from the end
            keep = sorted(rng.sample(range(len(truth)), k=rng.randint(0, len(truth))))
            order = kv.compaction(keep)
            assert sorted(order) == keep and all(order[i] == i for i in range(len(keep)) if i in keep)
            kv.keep(order)
            truth = [truth[i] for i in order]
        else:  # a step over a bucket of slots: running rows write at their own next column
            kv.reserve()
            kv.step_rows = rows_bucket(len(truth), kv.slots)
            kv.window = window_bucket(max(kv.lengths) + 1, kv.columns)
            banned = kv.banned(HEADS).reshape(kv.step_rows, HEADS, kv.window)[:, 0]
            for row, n in enumerate(kv.lengths):
                assert not banned[row, : n + 1].any() and banned[row, n + 1:].all()
            for layer in range(LAYERS):
                k = torch.randn(kv.step_rows, HEADS, 1, DIM, generator=gen)
                v = torch.randn(kv.step_rows, HEADS, 1, DIM, generator=gen)
                keys, _ = kv.write(layer, k, v)
                assert keys.shape == (kv.step_rows, HEADS, kv.window, DIM)
                for row in range(len(truth)):
                    pk, pv = truth[row][layer]
                    truth[row][layer] = (torch.cat([pk, k[row]], 1), torch.cat([pv, v[row]], 1))
            kv.advance()
        assert kv.rows == len(truth)
        assert kv.lens[: kv.rows].tolist() == kv.lengths == [t[0][0].shape[1] for t in truth]
        assert not kv.lens[kv.rows:].any()  # idle slots write their column 0 and read nothing
        for row, per_layer in enumerate(truth):
            keys, values = kv.row(row)
            for layer in range(LAYERS):
                assert torch.equal(keys[layer], per_layer[layer][0]) and torch.equal(values[layer], per_layer[layer][1])


def test_a_prefix_and_a_chunk_longer_than_the_buffers_regrow_them():
    """``open`` copies in a prefix longer than the columns there are, and ``reserve`` makes room
    for a prefill chunk's whole width (not one decode column's): every column is kept."""
    gen = torch.Generator().manual_seed(0)
    kv, shape = SlotKV("cpu", slots=4), (LAYERS, HEADS, DIM, torch.float32)
    kv.open([(0, None)], shape)
    n = kv.columns + 88
    entry = SimpleNamespace(keys=torch.randn(LAYERS, HEADS, n + 5, DIM, generator=gen),
                            values=torch.randn(LAYERS, HEADS, n + 5, DIM, generator=gen))
    assert kv.open([(n, entry)], shape) == 1
    width = kv.columns - n + 30  # room for one more column, not for the chunk
    kv.chunk, kv.step_first, kv.step_rows, kv.step_width = True, 0, 2, width
    kv.reserve()
    kv.window = window_bucket(n + width, kv.columns)
    kv.banned(HEADS)
    truth = [[(torch.zeros(HEADS, 0, DIM),) * 2 for _ in range(LAYERS)],
             [(entry.keys[layer, :, :n], entry.values[layer, :, :n]) for layer in range(LAYERS)]]
    for layer in range(LAYERS):
        k, v = torch.randn(2, HEADS, width, DIM, generator=gen), torch.randn(2, HEADS, width, DIM, generator=gen)
        kv.write(layer, k, v)
        for row in range(2):
            pk, pv = truth[row][layer]
            truth[row][layer] = (torch.cat([pk, k[row]], 1), torch.cat([pv, v[row]], 1))
    kv.chunk = False
    kv.fed(0, [width, width])
    assert kv.lengths == [width, n + width]
    for row, per_layer in enumerate(truth):
        keys, values = kv.row(row)
        for layer in range(LAYERS):
            assert torch.equal(keys[layer], per_layer[layer][0]) and torch.equal(values[layer], per_layer[layer][1])



def test_a_prefix_one_column_past_the_buffers_regrows_them_and_rows_past_the_slots_are_refused():
    gen = torch.Generator().manual_seed(0)
    kv, shape = SlotKV("cpu", slots=2), (LAYERS, HEADS, DIM, torch.float32)
    kv.open([(0, None)], shape)
    n = kv.columns + 1
    entry = SimpleNamespace(keys=torch.randn(LAYERS, HEADS, n, DIM, generator=gen),
                            values=torch.randn(LAYERS, HEADS, n, DIM, generator=gen))
    kv.open([(n, entry)], shape)
    assert kv.lengths == [0, n] and torch.equal(kv.row(1)[0], entry.keys)
    with pytest.raises(ValueError, match="3 rows do not fit in 2 slots"):
        kv.open([(0, None)], shape)

def test_buckets_cover_what_runs_and_stay_within_the_buffers():
    assert [rows_bucket(n, 256) for n in (1, 3, 5, 8, 9, 17, 128, 129, 250)] == [1, 4, 8, 8, 16, 32, 128, 160, 256]
    assert rows_bucket(200, 200) == 200
    assert [window_bucket(n, 8192) for n in (1, 64, 65, 513, 4097)] == [64, 64, 128, 768, 5120]
    assert window_bucket(600, 600) == 600


class _FakeGraph:
    """``torch.cuda.CUDAGraph`` on the CPU: a capture records the step's work (closures over the
    tensors it read then, as a graph records addresses), a replay reruns it."""
    capturing = None

    def __init__(self):
        self.work = []

    def replay(self):
        for work in self.work:
            work()


@contextlib.contextmanager
def _fake_capture(graph, pool=None, capture_error_mode=None):
    _FakeGraph.capturing = graph
    try:
        yield
    finally:
        _FakeGraph.capturing = None


def test_step_graphs_replay_and_are_captured_again_when_the_buffers_move(monkeypatch):
    """StepGraphs' bookkeeping, with torch.cuda's graph API faked on the CPU (tests/gpu runs the real
    one): a shape is captured once and replayed after; a new ``generation`` (buffers that moved)
    drops the graphs, which would replay the old buffers, and their pool; a capture the GPU refuses
    is a CaptureRefused and gets a fresh pool next time, anything else goes through as it is."""
    stream = SimpleNamespace(wait_stream=lambda other: None)
    pools = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: pools.append(object()) or pools[-1])
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", _fake_capture)
    buffers, calls, fail = {"x": torch.tensor([1.0])}, [], []

    def step(rows):
        calls.append(rows)
        if fail and _FakeGraph.capturing is not None:
            raise fail[0]
        x, out = buffers["x"], torch.zeros(rows)

        def work():
            out.copy_(x.expand(rows) * rows)
        work()
        if _FakeGraph.capturing is not None:
            _FakeGraph.capturing.work.append(work)
        return out

    graphs = StepGraphs(step, torch.device("cpu"))
    assert graphs((2,), 0).tolist() == [2.0, 2.0] and graphs.captured == 1 and len(calls) == 2  # a warm-up, the capture
    buffers["x"].fill_(3.0)  # new contents in the same buffer: the graph reads them
    assert graphs((2,), 0).tolist() == [6.0, 6.0] and graphs.captured == 1 and len(calls) == 2
    assert graphs((3,), 0).tolist() == [9.0] * 3 and graphs.shapes == [(2,), (3,)] and len(pools) == 1
    buffers["x"] = torch.tensor([5.0])  # the buffers moved
    assert graphs((2,), 1).tolist() == [10.0, 10.0] and graphs.shapes == [(2,)] and len(pools) == 2
    fail.append(RuntimeError("operation not permitted when stream is capturing"))
    with pytest.raises(CaptureRefused, match="not permitted"):
        graphs((4,), 1)
    fail[0] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        graphs((4,), 1)
    assert len(pools) == 3  # a failed capture lets its pool go: the next capture asks for a new one
    fail.clear()
    assert graphs((4,), 1).tolist() == [20.0] * 4 and graphs.captured == 4 and len(pools) == 4


def _requests(n, adapters, max_tokens=14):
    return [GenerationRequest(tuple(range(5, 9 + (i * 7) % 23)), SamplingParams(temperature=1.0, max_tokens=max_tokens + i % 6,
                                                                                seed=i), adapters[i % len(adapters)])
            for i in range(n)]


def _generate(engine, reqs):
    async def go():
        return await asyncio.gather(*(engine.generate(r) for r in reqs))
    return asyncio.run(go())


@pytest.mark.parametrize("max_batch,adapters", [(5, (None, "alpha", "beta")), (64, (None, "alpha", "beta")),
                                                (5, ("alpha",))], ids=["mixed-5", "mixed-64", "one-adapter-5"])
def test_the_static_path_samples_what_the_batch_path_samples(max_batch, adapters):
    outs, reqs, again_reqs = {}, _requests(18, adapters), None
    for static in (False, True):
        engine = tiny_engine(static=static, max_batch=max_batch, max_prefill=4)
        for seed, name in enumerate(("alpha", "beta"), 1):
            if name in adapters:
                engine.add_adapter(name)
                randomize(engine, name, seed)
        assert (engine.decode_path == "static:eager") == static
        first = _generate(engine, reqs)
        # again, with the prefix cache now holding the first round's rows: two-run prefills (the
        # prompts from the batch path's first round, so both paths get the same ones)
        again_reqs = again_reqs or [GenerationRequest(r.prompt_ids + tuple(o.token_ids[:3]), r.sampling, r.adapter)
                                    for r, o in zip(reqs, first)]
        again = _generate(engine, again_reqs)
        outs[static] = [(o.token_ids, o.logprobs) for o in first + again]
        assert engine.stats.prefix_hit_tokens > 0
        if static:
            assert engine._slots.mode(list(adapters)) == ("one" if adapters == ("alpha",) else "mixed")
        asyncio.run(engine.aclose())
    assert_same_draws(outs[True], outs[False])


def test_rows_that_outgrow_a_window_bucket_sample_what_the_batch_path_samples():
    """A step reads a window of columns bucketed by the longest row (64 at a time here), which must
    hold its next column too: each row in turn is the longest as its length reaches 64, the edge of a
    bucket, and they sample what the batch path samples."""
    reqs = [GenerationRequest(tuple(range(5, 5 + n)), SamplingParams(temperature=1.0, max_tokens=72 - n, ignore_eos=True,
                                                                     seed=n), adapter)
            for n, adapter in ((3, None), (20, "alpha"), (41, None), (62, "alpha"))]
    outs = {}
    for static in (False, True):
        engine = tiny_engine(static=static, max_batch=4)
        engine.add_adapter("alpha")
        randomize(engine, "alpha", 1)
        outs[static] = [(o.token_ids, o.logprobs) for o in _generate(engine, reqs)]
        asyncio.run(engine.aclose())
    assert_same_draws(outs[True], outs[False])


def test_slot_lora_copies_new_weights_in_place_and_grows_only_for_more_adapters():
    engine = tiny_engine(static=True)
    slots = engine._slots
    engine.add_adapter("alpha")
    slots.sync()
    assert slots.capacity == 0 and slots.mode(["alpha"]) == "none"  # a fresh adapter (B = 0) is the base model
    randomize(engine, "alpha", 1)
    slots.sync()
    generation, stacks = slots.generation, {k: v.data_ptr() for k, v in slots.a_t.items()}
    assert slots.mode([None, "alpha"]) == "mixed" and slots.mode([None, "__base__"]) == "none"
    assert slots.mode(["alpha", "alpha"]) == "one"  # one slot, every row in it: no row masks
    randomize(engine, "alpha", 2)  # a training step's new weights: same buffers, new contents
    slots.sync()
    assert slots.generation == generation and {k: v.data_ptr() for k, v in slots.a_t.items()} == stacks
    key = next(iter(slots.a_t))
    module = key[0] if isinstance(key, tuple) else key
    a = lora_state(engine.model, 2, std=0.5)[f"base_model.model.{module}.lora_A.weight"]
    assert torch.equal(slots.a_t[key][:, : a.shape[0]], a.T)
    engine.add_adapter("beta")
    randomize(engine, "beta", 3)
    slots.sync()
    assert slots.generation > generation and slots.capacity == 2 and set(slots.slots) == {"alpha", "beta"}
    assert slots.mode(["alpha", "alpha"]) == "mixed"  # two slots: the masks pick each row's
    engine.remove_adapter("alpha")
    slots.sync()
    assert set(slots.slots) == {"beta"} and slots.capacity == 2  # a slot frees; nothing moves


def test_an_adapter_whose_rank_or_modules_grow_serves_its_new_weights():
    """The slots' stacks are kept while the adapters fit them: new weights of a higher rank, or on
    modules no adapter had, need new ones (the old rank cannot hold them; the old modules have no
    stack for the new)."""
    engine = tiny_engine(static=True, max_batch=4)
    engine.add_adapter("alpha")
    prompt = tuple(range(5, 30))
    try:
        for rank, modules in ((4, ("q_proj", "v_proj")), (8, ("q_proj", "v_proj")), (8, None)):
            engine.update_adapter("alpha", lora_state(engine.model, rank, rank=rank, std=0.5, modules=modules))
            out = asyncio.run(engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=6, seed=rank), "alpha")))
            reference = engine.teacher_forced_logprobs(list(prompt), out.token_ids, "alpha")
            assert max(abs(a - b) for a, b in zip(reference, out.logprobs)) < 1e-4
    finally:
        asyncio.run(engine.aclose())


def test_the_gpu_forms_of_the_step_give_the_same_samples_on_the_cpu():
    """decoder.py's GPU forms (fused RMSNorm, roll-based rotary, biased baddbmm attention), forced
    on here in fp32: what they sample and its logprobs match the CPU forms'."""
    outs = {}
    for gpu in (False, True):
        engine = tiny_engine(static=True, max_batch=5, max_prefill=4)
        engine.add_adapter("alpha")
        randomize(engine, "alpha", 1)
        engine._fused.gpu = gpu
        outs[gpu] = [(o.token_ids, o.logprobs) for o in _generate(engine, _requests(9, (None, "alpha")))]
        asyncio.run(engine.aclose())
    assert_same_draws(outs[True], outs[False])


def test_the_gpu_forms_launch_fewer_kernels_per_layer():
    """What a GPU replays per decoder layer (``graphs.count_kernels``, in bf16 as there): a guard on
    the step's kernel count, which sets its time on a GPU (docs/gpu.md). Per layer: two norms, four
    projections (the residual adds inside two), rotary as two matmuls, two cache writes, three
    kernels of attention, the gated activation's two; each LoRA key adds its two matmuls, and a
    mixed batch its row mask."""
    engine = tiny_engine("bfloat16", static=True, max_batch=4, cpu=NO_ONEDNN)
    for seed, name in enumerate(("alpha", "beta")):
        engine.add_adapter(name)
        randomize(engine, name, seed)
    _generate(engine, _requests(3, (None, "alpha", "beta"), max_tokens=2))
    decoder, layers = engine._fused, engine._fused.layers

    def per_layer(gpu: bool, mode: str) -> int:
        decoder.gpu, counts = gpu, []
        for decoder.layers in (layers, layers[:1]):
            with torch.inference_mode():
                counts.append(sum(count_kernels(lambda: engine._static_forward(4, 64, mode)).values()))
        decoder.layers = layers
        return (counts[0] - counts[1]) // (len(layers) - 1)

    gpu = {mode: per_layer(True, mode) for mode in ("none", "one", "mixed")}
    assert gpu == {"none": 15, "one": 23, "mixed": 27}
    assert per_layer(False, "none") > gpu["none"]  # the CPU's forms: transformers' ops, one by one


def test_the_fused_prefill_samples_what_transformers_prefill_samples(monkeypatch):
    """The static path's prefill through the fused step (``SlotKV.open``, then the prompts' rests
    in chunks) against transformers' forward on the same engine. Chunks of 5 tokens here, so rests
    span several passes and rows end in different ones; the second round's prompts extend the
    first's, so their prefixes come from the prefix cache; mixed adapters throughout."""
    import orchestrator.engines.hf as hf

    monkeypatch.setattr(hf, "_PREFILL_CHUNK", 5)
    outs, passes, again = {}, {}, None
    for fused in (False, True):
        engine = tiny_engine(static=True, max_batch=6, max_prefill=4, fused_prefill=fused)
        outs[fused], again = _two_rounds(engine, _requests(12, (None, "alpha", "beta")), again)
        passes[fused] = engine.stats.prefill_passes
    assert_same_draws(outs[True], outs[False])
    assert passes[True] > passes[False] > 0  # 5-token chunks: a long rest takes several passes


def _two_rounds(engine, reqs, again=None):
    """Two adapters with random weights, ``reqs``, then ``again`` (default: prompts that extend the
    first round's, so their prefixes come from the prefix cache). Returns every request's (tokens,
    logprobs), and the second round's requests, for the next engine to run the same ones."""
    for seed, name in enumerate(("alpha", "beta"), 1):
        engine.add_adapter(name)
        randomize(engine, name, seed)
    first = _generate(engine, reqs)
    again = again or [GenerationRequest(r.prompt_ids + tuple(o.token_ids) + (7, 8), r.sampling, r.adapter)
                      for r, o in zip(reqs, first)]
    outs = [(o.token_ids, o.logprobs) for o in first + _generate(engine, again)]
    assert engine.stats.prefix_hit_tokens > 0
    asyncio.run(engine.aclose())
    return outs, again


def test_a_prefill_over_every_slot_samples_what_a_prefill_of_the_new_rows_samples():
    """Short rests (next turns) prefill in a chunk over every slot's bucket, the shape a GPU replays
    from a graph (``HFEngine._prefill_in_step``, run eagerly here): running rows and idle slots feed
    padding, whose keys land past their ends. Rows join while others run (6 slots, 18 requests
    of unequal budgets), the second round's prompts extend the first's (prefix-cache hits), and
    adapters are mixed: every request samples what it samples when only the new rows go through.
    One prompt, admitted with three short ones, is longer than a step's chunk (_STEP_PREFILL): that
    prefill goes in chunks over the new rows, all four of them."""
    reqs = _requests(18, (None, "alpha", "beta"))
    reqs[1] = dataclasses.replace(reqs[1], prompt_ids=tuple(range(5, 5 + _STEP_PREFILL + 16)))
    outs, again = {}, None
    for in_step in (False, True):
        engine = tiny_engine(static=True, max_batch=6, max_prefill=4)
        engine.step_prefill = in_step
        outs[in_step], again = _two_rounds(engine, reqs, again)
    assert_same_draws(outs[True], outs[False])


class Failing:
    """A StepGraphs stand-in (no CUDA here) whose every call raises ``error``: a refused capture,
    or a replay's own fault."""

    def __init__(self, error: Exception):
        self.error, self.calls = error, 0

    def __call__(self, shape, generation):
        self.calls += 1
        raise self.error


def test_a_prefill_graph_the_gpu_refuses_leaves_the_prefill_eager():
    """Should capturing a prefill chunk fail, the engine logs it once and prefills eagerly from
    then on, the requests unharmed (decode graphs stand in as eager steps here: no CUDA)."""
    refused = Failing(CaptureRefused("operation not permitted when stream is capturing"))
    reqs = _requests(8, (None, "alpha"))
    outs = {}
    for graphs in (False, True):
        engine = tiny_engine(static=True, max_batch=6, max_prefill=4)
        engine.add_adapter("alpha")
        randomize(engine, "alpha", 1)
        engine.step_prefill = True
        if graphs:
            engine.cuda_graphs = True
            engine._graphs = lambda shape, generation, engine=engine: engine._static_forward(*shape)
            engine._chunk_graphs = refused
        outs[graphs] = [(o.token_ids, o.logprobs) for o in _generate(engine, reqs)]
        asyncio.run(engine.aclose())
    assert refused.calls == 1 and engine._chunk_graphs is None
    assert outs[True] == outs[False]


def test_a_decode_graph_the_gpu_refuses_leaves_decode_eager():
    """Should capturing a decode step fail, the engine logs it, reruns the step eagerly and stays
    eager (its decode path says so), the requests unharmed; it was an error for every request."""
    refused = Failing(CaptureRefused("CUDA error: operation not permitted when stream is capturing"))
    reqs = _requests(8, (None, "alpha"))
    outs = {}
    for graphs in (False, True):
        engine = tiny_engine(static=True, max_batch=6)
        engine.add_adapter("alpha")
        randomize(engine, "alpha", 1)
        if graphs:
            engine.cuda_graphs, engine._graphs = True, refused
        outs[graphs] = [(o.token_ids, o.logprobs) for o in _generate(engine, reqs)]
        asyncio.run(engine.aclose())
    assert refused.calls == 1 and engine.decode_path == "static:eager"
    assert outs[True] == outs[False]
    # a replay's own failure (out of memory, a device assert) is no refused capture: the step fails
    engine = tiny_engine(static=True, max_batch=6)
    engine.cuda_graphs = True
    engine._graphs = Failing(RuntimeError("CUDA out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        _generate(engine, reqs[:1])
    assert engine.decode_path == "static:graphs"
    asyncio.run(engine.aclose())


def _layered_engine(layers: int, **options):
    """The tiny model's shape with ``layers`` decoder layers (random bf16 weights), on the static path."""
    import copy

    from transformers import LlamaForCausalLM

    from orchestrator.engines.hf import HFEngine
    from orchestrator.models import LoadedModel, load_model

    tiny = load_model("tiny")
    config = copy.deepcopy(tiny.model.config)
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return HFEngine(LoadedModel(model, tiny.tokenizer, "tiny", torch.bfloat16), static=True, cpu=NO_ONEDNN, **options)


def test_the_fused_prefill_launches_far_fewer_kernels_per_layer():
    """A multi-turn episode's next turn: a prefix from the prefix cache and a short rest, four rows
    with mixed adapters, in bf16 with the GPU's forms. What one admission launches per decoder
    layer (``graphs.count_kernels``, 3 layers less 1): through transformers' forward the prefix is
    rebuilt layer by layer as a left-padded cache and each layer runs transformers' ops; the fused
    step copies each row's prefix into its slot once, for all layers, and each layer runs a decode
    step's kernels: 80 kernels a layer against 31 here. On SmolLM2's 30 layers a whole admission
    of 8 rows counted 2,774 kernels against 1,030 (docs/gpu.md)."""
    per_layer = {}
    for fused in (False, True):
        counts = []
        for layers in (3, 1):
            engine = _layered_engine(layers, max_batch=8, max_prefill=8, fused_prefill=fused)
            engine._fused.gpu = True
            engine.add_adapter("alpha")
            randomize(engine, "alpha", 1)
            reqs = [GenerationRequest(tuple(range(5, 45)) + (50 + i,), SamplingParams(temperature=1.0, max_tokens=6, seed=i),
                                      (None, "alpha")[i % 2]) for i in range(4)]
            first = _generate(engine, reqs)
            prefill, counted = engine._prefill, Counter()
            engine._prefill = lambda seqs, prefill=prefill, counted=counted: counted.update(count_kernels(lambda: prefill(seqs)))
            _generate(engine, [GenerationRequest(r.prompt_ids + tuple(o.token_ids) + (7, 8, 9, 10), r.sampling, r.adapter)
                               for r, o in zip(reqs, first)])
            assert engine.stats.prefix_hit_tokens >= 4 * 32
            counts.append(sum(counted.values()))
            asyncio.run(engine.aclose())
        per_layer[fused] = (counts[0] - counts[1]) / 2
    assert per_layer[True] < 0.5 * per_layer[False], per_layer
