"""The HF engine on the tiny model: logprobs, mixed adapters, stops, live adapters, cancellation."""
from __future__ import annotations

import asyncio
import json

import pytest
import torch
from orchestrator.engines.base import GenerationRequest, SamplingParams
from support import AVX2, assert_same_draws, lora_state, peft_dir, randomize, requires_bf16, tiny_engine

PROMPTS = [
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "What is two plus two? Answer with a number."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello to the reviewer."}],
    [{"role": "user", "content": "Write one JSON object with a key 'verdict'."}],
]


@pytest.fixture(params=[False, True], ids=["batch-kv", "static"])
def engine(request):
    """Both decode paths: the CPU's (left-padded BatchKV) and the GPU's static one, run eagerly here."""
    e = tiny_engine(max_batch=8, max_prefill=3, static=request.param)
    yield e
    asyncio.run(e.aclose())


def request(engine, i, adapter=None, **sampling) -> GenerationRequest:
    params = {"temperature": 1.0, "max_tokens": 12, "seed": 100 + i, **sampling}
    return GenerationRequest(tuple(engine.apply_chat_template(PROMPTS[i % len(PROMPTS)])), SamplingParams(**params), adapter)


async def gather(engine, requests):
    return await asyncio.gather(*(engine.generate(r) for r in requests))


def test_sampling_logprobs_match_teacher_forcing(engine):
    # fp32: the KV-cached, left-padded batch agrees with a plain full forward within 1e-4
    engine.add_adapter("alpha")
    randomize(engine, "alpha", 1)
    reqs = [request(engine, i, adapter=("alpha" if i % 2 else None), temperature=0.7) for i in range(6)]
    outs = asyncio.run(gather(engine, reqs))
    for r, out in zip(reqs, outs):
        ref = engine.teacher_forced_logprobs(list(r.prompt_ids), out.token_ids, r.adapter, 0.7)
        assert len(ref) == len(out.logprobs) > 0
        assert max(abs(a - b) for a, b in zip(ref, out.logprobs)) < 1e-4


@requires_bf16
@pytest.mark.parametrize("cpu", [None, AVX2], ids=["this-cpu", "avx2"])
def test_bf16_logprobs_agree_loosely(cpu):
    """--dtype bfloat16 runs on any x86-64 CPU: on an AVX2-only one the fused step's weights are fp32."""
    e = tiny_engine("bfloat16", cpu=cpu)
    try:
        r = request(e, 0)
        out = asyncio.run(e.generate(r))
        ref = e.teacher_forced_logprobs(list(r.prompt_ids), out.token_ids, None, 1.0)
        assert len(ref) == len(out.logprobs) > 0
        assert max(abs(a - b) for a, b in zip(ref, out.logprobs)) < 0.1  # bf16 rounding of activations
        if cpu is AVX2:
            assert e.decode_path == "fused:onednn-fp32"
    finally:
        asyncio.run(e.aclose())


def test_top_logprobs_are_the_sampling_distributions_most_likely_tokens(engine):
    """serve's top_logprobs: the k most likely tokens at each step, with the logprobs a teacher-forced
    pass at the request's temperature gives them; asking for them changes nothing sampled."""
    reqs = [request(engine, 0, temperature=0.0, max_tokens=4, top_logprobs=3),
            request(engine, 1, temperature=0.7, max_tokens=4, top_logprobs=2), request(engine, 1, temperature=0.7, max_tokens=4)]
    greedy, top, plain = asyncio.run(gather(engine, reqs))
    assert plain.top_logprobs is None and top.token_ids == plain.token_ids and top.logprobs == plain.logprobs
    assert [alts[0] for alts in greedy.top_logprobs] == list(zip(greedy.token_ids, greedy.logprobs))
    for r, out in ((reqs[0], greedy), (reqs[1], top)):
        assert len(out.top_logprobs) == len(out.token_ids)
        for i, alts in enumerate(out.top_logprobs):
            assert len(alts) == r.sampling.top_logprobs and [lp for _, lp in alts] == sorted((lp for _, lp in alts), reverse=True)
            for token, lp in alts:
                ref = engine.teacher_forced_logprobs(list(r.prompt_ids) + out.token_ids[:i], [token], None, r.sampling.temperature)
                assert abs(ref[0] - lp) < 1e-4


def test_top_logprobs_leave_out_what_the_grammar_bans(engine):
    schema = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    r = request(engine, 3, max_tokens=12, top_logprobs=4)
    out = asyncio.run(engine.generate(GenerationRequest(r.prompt_ids, r.sampling, json_schema=schema)))
    assert json.loads(out.text) in ({"ok": True}, {"ok": False})
    assert len(out.top_logprobs) == len(out.token_ids) and all(1 <= len(alts) <= 4 for alts in out.top_logprobs)
    assert any(len(alts) == 1 for alts in out.top_logprobs)  # where the grammar allows one token only
    assert all(lp > float("-inf") for alts in out.top_logprobs for _, lp in alts)



def test_a_seeded_reply_draws_its_ith_token_with_the_ith_uniform_of_its_seed(engine):
    """What a request samples is a pure function of its seed: token i is the inverse-CDF draw of
    counter_uniforms(seed, i) from the model's distribution after the tokens before it."""
    from orchestrator.engines.sampling import counter_uniforms, sample_rows

    r = request(engine, 1, max_tokens=8, ignore_eos=True, temperature=3.0)  # a flat distribution: draws spread
    out = asyncio.run(engine.generate(r))
    for i, token in enumerate(out.token_ids):
        with torch.inference_mode():
            logits = engine.model(torch.tensor([list(r.prompt_ids) + out.token_ids[:i]])).logits[:, -1]
        u = counter_uniforms(torch.tensor([r.sampling.seed]), torch.tensor([i]))
        assert sample_rows(logits, [3.0], [1.0], u)[0] == [token]


def test_unseeded_requests_draw_apart(engine):
    reqs = [request(engine, 1, max_tokens=12, ignore_eos=True, seed=None) for _ in range(2)]
    a, b = asyncio.run(gather(engine, reqs))
    assert a.token_ids != b.token_ids

def test_mixed_adapter_batch_equals_single_adapter_runs(engine):
    for name, seed in (("alpha", 1), ("beta", 2)):
        engine.add_adapter(name)
        randomize(engine, name, seed)
    adapters = [None, "alpha", "beta", "alpha", "beta", None, "beta", "alpha"]
    reqs = [request(engine, i, adapter=ad) for i, ad in enumerate(adapters)]
    mixed = asyncio.run(gather(engine, reqs))
    alone = [asyncio.run(engine.generate(r)) for r in reqs]
    assert [m.token_ids for m in mixed] == [a.token_ids for a in alone]
    # and the adapters really differ: the same request under another adapter samples differently
    others = asyncio.run(gather(engine, [GenerationRequest(r.prompt_ids, r.sampling, "beta" if r.adapter != "beta" else "alpha") for r in reqs]))
    assert sum(o.token_ids != m.token_ids for o, m in zip(others, mixed)) >= len(reqs) // 2
    assert [m.adapter_version for m in mixed] == [0, 2, 2, 2, 2, 0, 2, 2]


def test_max_tokens_and_stop_strings(engine):
    out = asyncio.run(engine.generate(request(engine, 0, max_tokens=5, temperature=0.0)))
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    full = asyncio.run(engine.generate(request(engine, 1, max_tokens=16)))  # seeded: repeatable
    k = next(i for i in range(1, len(full.text) - 1) if not full.text[i : i + 2].isspace() and " " not in full.text[i : i + 2])
    stop = full.text[k : k + 2]
    cut = asyncio.run(engine.generate(request(engine, 1, max_tokens=16, stop=(stop,))))
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]
    assert stop not in cut.text
    empty = asyncio.run(engine.generate(request(engine, 1, max_tokens=16, stop=("",))))  # "" is no stop string
    assert (empty.text, empty.finish_reason) == (full.text, full.finish_reason)


def test_stop_strings_are_looked_for_in_the_tail_of_a_reply(engine, monkeypatch):
    """Each step decoded the whole reply to look for stop strings, a row's step costing more the
    longer its reply; only the tail that can end in a stop string is decoded, the whole once."""
    full = asyncio.run(engine.generate(request(engine, 1, max_tokens=48, ignore_eos=True)))
    k = max(i for i in range(len(full.text) - 1) if full.text.find(full.text[i : i + 2]) == i)
    stop = full.text[k : k + 2]  # first seen late in the reply
    decoded, decode = [], engine.decode
    monkeypatch.setattr(engine, "decode", lambda ids: decoded.append(len(ids)) or decode(ids))
    cut = asyncio.run(engine.generate(request(engine, 1, max_tokens=48, ignore_eos=True, stop=(stop,))))
    assert cut.finish_reason == "stop" and cut.text == full.text[:k]
    assert len(cut.token_ids) > 4 * len(stop) + 2  # longer than the tail: the whole was decoded once
    assert sorted(decoded)[-2:] == [4 * len(stop) + 2, len(cut.token_ids)]


def test_a_token_that_completes_two_stop_strings_cuts_the_text_at_the_first(engine):
    """The text was cut at the first stop string listed, and kept the other where it came earlier."""
    def found() -> tuple[int, int, str, str]:  # a seed whose reply has a token bringing two new characters
        for seed in range(100, 132):  # seeded: repeatable, whatever the tiny model's weights
            full = asyncio.run(engine.generate(request(engine, 1, max_tokens=16, ignore_eos=True, seed=seed)))
            for j in range(1, len(full.token_ids)):
                before = engine.decode(full.token_ids[:j])
                piece = engine.decode(full.token_ids[:j + 1])[len(before):]
                if len(piece) >= 2 and piece[0] not in before and piece[-1] not in before + piece[:-1]:
                    return seed, j, before, piece
        pytest.fail("no token brings two characters new to the text")

    seed, j, before, piece = found()
    stops = (piece[-1], piece[0])  # both first appear in token j, the later one listed first
    cut = asyncio.run(engine.generate(request(engine, 1, max_tokens=16, ignore_eos=True, seed=seed, stop=stops)))
    assert cut.finish_reason == "stop" and cut.text == before and len(cut.token_ids) == j + 1


def test_ignore_eos_samples_past_an_end_of_turn_token(engine):
    full = asyncio.run(engine.generate(request(engine, 2, max_tokens=8)))  # seeded: repeatable
    engine.eos_ids = {full.token_ids[2]}  # pretend its third token ends the turn
    assert asyncio.run(engine.generate(request(engine, 2, max_tokens=8))).finish_reason == "eos"
    kept = asyncio.run(engine.generate(request(engine, 2, max_tokens=8, ignore_eos=True)))
    assert kept.token_ids == full.token_ids and kept.finish_reason == "length"


def test_adapter_update_changes_outputs_and_versions(engine):
    assert engine.add_adapter("p") == 1
    r = request(engine, 2, adapter="p", temperature=0.0, max_tokens=8)
    base = asyncio.run(engine.generate(request(engine, 2, temperature=0.0, max_tokens=8)))
    fresh = asyncio.run(engine.generate(r))
    assert fresh.token_ids == base.token_ids and fresh.adapter_version == 1  # B = 0: same as base
    assert randomize(engine, "p", 7) == 2
    updated = asyncio.run(engine.generate(r))
    assert updated.adapter_version == 2 and updated.token_ids != fresh.token_ids
    # a training step's next weights: served, not the stack of the last ones (the batch path keeps stacks)
    assert randomize(engine, "p", 8) == 3
    engine.add_adapter("twin")
    randomize(engine, "twin", 8)
    again, twin = (asyncio.run(engine.generate(GenerationRequest(r.prompt_ids, r.sampling, a))) for a in ("p", "twin"))
    assert again.token_ids == twin.token_ids and again.logprobs == pytest.approx(twin.logprobs, abs=1e-6)
    engine.remove_adapter("p")
    gone = asyncio.run(engine.generate(r))
    assert gone.adapter_version == 0 and gone.token_ids == base.token_ids


def test_unknown_adapter_samples_the_base_model(engine):
    base = asyncio.run(engine.generate(request(engine, 3, temperature=0.0)))
    other = asyncio.run(engine.generate(request(engine, 3, adapter="never-trained", temperature=0.0)))
    assert other.token_ids == base.token_ids and other.adapter_version == 0


def test_cancellation_and_timeouts_leave_nothing_stuck(engine):
    async def scenario():
        long = [engine.generate(request(engine, i, max_tokens=400, temperature=1.0)) for i in range(6)]
        tasks = [asyncio.ensure_future(c) for c in long]
        await asyncio.sleep(0.2)
        for t in tasks[:3]:
            t.cancel()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.generate(request(engine, 0, max_tokens=400)), 0.05)
        rest = await asyncio.gather(*tasks[3:])
        assert all(len(r.token_ids) > 0 for r in rest)
        assert all(t.cancelled() for t in tasks[:3])
        for _ in range(100):
            if engine.busy == 0:
                break
            await asyncio.sleep(0.05)
        return engine.busy

    assert asyncio.run(scenario()) == 0


def test_busy_leaves_out_queued_requests_cancelled(engine):
    """Cancelled while the batch was full (serve's clients gone), they were counted as queued until
    rows freed up for the scheduler to drop them."""
    async def scenario():
        rows = engine.max_batch
        tasks = [asyncio.ensure_future(engine.generate(request(engine, i, max_tokens=400, ignore_eos=True)))
                 for i in range(rows + 3)]
        for _ in range(1000):
            if len(engine._active) == rows:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail(f"the batch never filled: {len(engine._active)} of {rows} rows")
        for t in tasks[rows:]:  # still queued: the batch is full for 400 tokens
            t.cancel()
        await asyncio.sleep(0)  # their generate marks them cancelled
        busy = engine.busy
        for t in tasks[:rows]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return busy

    assert asyncio.run(scenario()) == engine.max_batch



def test_a_request_cancelled_in_the_queue_is_never_prefilled(engine, monkeypatch):
    prefilled, prefill = [], engine._prefill
    monkeypatch.setattr(engine, "_prefill", lambda seqs: prefilled.extend(s.request.sampling.seed for s in seqs) or prefill(seqs))

    async def scenario():
        rows = engine.max_batch
        tasks = [asyncio.ensure_future(engine.generate(request(engine, i, max_tokens=30, ignore_eos=True)))
                 for i in range(rows + 2)]
        while len(engine._active) < rows:
            await asyncio.sleep(0.01)
        for t in tasks[rows:]:  # queued behind a full batch
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # the rows finish, freeing room for the queue
        for _ in range(100):
            if engine._pending.empty() and not engine._active:
                break
            await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert sorted(prefilled) == [100 + i for i in range(engine.max_batch)]

def test_many_concurrent_requests_all_complete(engine):
    outs = asyncio.run(gather(engine, [request(engine, i, max_tokens=4 + i % 5) for i in range(20)]))
    assert [len(o.token_ids) <= 4 + i % 5 for i, o in enumerate(outs)] == [True] * 20
    assert engine.busy == 0


def test_newcomers_prefill_at_most_max_prefill_together_within_max_batch(engine):
    """11 requests on an engine of 8 rows and 3 newcomers a prefill: admitted 3 at a time, the
    last as rows free up, never more rows than max_batch."""
    admitted, prefill = [], engine._prefill

    def counting(seqs):
        admitted.append((len(seqs), len(engine._active)))
        prefill(seqs)

    engine._prefill = counting
    outs = asyncio.run(gather(engine, [request(engine, i, max_tokens=3 + i % 4, ignore_eos=True) for i in range(11)]))
    assert [len(o.token_ids) for o in outs] == [3 + i % 4 for i in range(11)]
    assert sum(n for n, _ in admitted) == 11
    assert max(n for n, _ in admitted) == engine.max_prefill == 3
    assert max(n + running for n, running in admitted) <= engine.max_batch


def test_a_step_that_fails_fails_its_rows_and_the_engine_serves_on(engine, monkeypatch):
    """A model fault mid-decode fails the requests in the batch, and their cache rows go with
    them: the same requests afterwards sample what they sampled before."""
    reqs = [request(engine, i, max_tokens=6, ignore_eos=True) for i in range(3)]
    before = asyncio.run(gather(engine, reqs))
    sample, calls = type(engine)._sample, []

    def faulty(self, seqs, logits):
        calls.append(len(seqs))
        if len(calls) == 3:
            raise RuntimeError("the device faulted")
        return sample(self, seqs, logits)

    monkeypatch.setattr(type(engine), "_sample", faulty)

    async def together():
        return await asyncio.gather(*(engine.generate(r) for r in reqs), return_exceptions=True)

    assert all(isinstance(o, RuntimeError) and "faulted" in str(o) for o in asyncio.run(together()))
    monkeypatch.setattr(type(engine), "_sample", sample)
    assert [o.token_ids for o in asyncio.run(gather(engine, reqs))] == [o.token_ids for o in before]
    assert engine.busy == 0


def test_a_fault_in_one_requests_booking_fails_that_request_alone(engine, monkeypatch):
    """A row whose token cannot be booked (its grammar refuses it, say) fails its own request; the
    rest of the batch samples on, what each samples alone, and the engine keeps serving."""
    reqs = [request(engine, i, max_tokens=6, ignore_eos=True) for i in range(4)]
    alone = asyncio.run(gather(engine, reqs[:1] + reqs[2:]))
    check_done = type(engine)._check_done

    def faulty(self, seq):
        if seq.request is reqs[1] and len(seq.tokens) == 3:
            raise RuntimeError("this row's booking broke")
        check_done(self, seq)

    monkeypatch.setattr(type(engine), "_check_done", faulty)

    async def together():
        return await asyncio.gather(*(engine.generate(r) for r in reqs), return_exceptions=True)

    outs = asyncio.run(together())
    assert isinstance(outs[1], RuntimeError) and "booking broke" in str(outs[1])
    assert [o.token_ids for o in outs[:1] + outs[2:]] == [o.token_ids for o in alone]
    assert engine.busy == 0
    assert len(asyncio.run(gather(engine, reqs[:1]))[0].token_ids) == 6


@pytest.mark.parametrize("prompt", [(), (5, 10**6)], ids=["empty", "past-vocab"])
def test_a_prompt_the_model_cannot_read_fails_that_request_alone(engine, prompt):
    """It failed the whole batch's step, its neighbours' requests with an IndexError (or a TypeError)."""
    good = request(engine, 0, max_tokens=4, ignore_eos=True)

    async def together():
        return await asyncio.gather(engine.generate(good), engine.generate(GenerationRequest(prompt)),
                                    return_exceptions=True)

    ok, bad = asyncio.run(together())
    assert isinstance(bad, ValueError) and ("empty" in str(bad) or "vocabulary" in str(bad))
    assert len(ok.token_ids) == 4 and engine.busy == 0


def test_a_prompt_that_fills_the_context_is_refused_and_a_reply_stops_where_it_ends(engine, monkeypatch):
    """Both ran on past the model's positions, sampling noise (a model with learnt positions would fail its batch)."""
    r = request(engine, 0, max_tokens=12, ignore_eos=True)
    monkeypatch.setattr(engine.model.config, "max_position_embeddings", len(r.prompt_ids) + 3)
    out = asyncio.run(engine.generate(r))
    assert len(out.token_ids) == 3 and out.finish_reason == "length"
    monkeypatch.setattr(engine.model.config, "max_position_embeddings", len(r.prompt_ids))
    with pytest.raises(ValueError, match="no room for a reply in the model's context"):
        asyncio.run(engine.generate(r))


def test_a_sliding_window_model_is_served_within_its_window():
    """A model with a sliding window (Mistral v0.1, Gemma 2, Phi-3): a prompt past the window failed
    every request of its batch with a shape traceback, and a reply that crossed it, or a turn
    whose prefix came from the prefix cache, sampled with keys the model does not attend to."""
    from orchestrator.engines.hf import HFEngine
    from orchestrator.models import LoadedModel, load_model
    from transformers import MistralConfig, MistralForCausalLM

    tiny = load_model("tiny", dtype="float32")
    config = MistralConfig(**{**tiny.model.config.to_dict(), "model_type": "mistral", "sliding_window": 48})
    torch.manual_seed(0)
    engine = HFEngine(LoadedModel(MistralForCausalLM(config).eval(), tiny.tokenizer, "mistral", torch.float32), max_prefill=2)
    try:
        assert engine.context_length == 48
        first = request(engine, 0, max_tokens=6, ignore_eos=True)  # 34 prompt tokens
        out = asyncio.run(engine.generate(first))
        # the next turn (a prefix hit, were the cache on) beside a longer prompt; replies end at the window
        turn = GenerationRequest(first.prompt_ids + tuple(out.token_ids) + tuple(engine.encode(" ok")),
                                 SamplingParams(max_tokens=40, seed=7, ignore_eos=True))
        reqs = [turn, request(engine, 3, max_tokens=40, ignore_eos=True)]
        for r, o in zip(reqs, asyncio.run(gather(engine, reqs))):
            assert len(r.prompt_ids) + len(o.token_ids) <= 48 and o.finish_reason == "length"
            ref = engine.teacher_forced_logprobs(list(r.prompt_ids), o.token_ids, None, 1.0)
            assert max(abs(a - b) for a, b in zip(ref, o.logprobs)) < 1e-4
        with pytest.raises(ValueError, match="context of 48 tokens"):
            asyncio.run(engine.generate(GenerationRequest(tuple(range(1, 60)))))
    finally:
        asyncio.run(engine.aclose())


def test_a_longrope_model_is_served_within_its_original_window():
    """Past original_max_position_embeddings transformers gives every position longrope's long
    factors (Phi-3 128k), which cached keys and shorter batch-mates cannot follow: a reply
    crossing it sampled logprobs 0.005 off teacher forcing; it now ends there."""
    from orchestrator.engines.hf import HFEngine
    from orchestrator.models import LoadedModel, load_model
    from transformers import AutoModelForCausalLM, Phi3Config

    tokenizer = load_model("tiny").tokenizer
    config = Phi3Config(vocab_size=len(tokenizer), pad_token_id=0, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        original_max_position_embeddings=32,
                        rope_scaling={"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [8.0] * 8})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    e = HFEngine(LoadedModel(model=model, tokenizer=tokenizer, name="phi3", dtype=torch.float32))
    try:
        r = GenerationRequest(tuple(range(5, 30)), SamplingParams(max_tokens=8, seed=1, ignore_eos=True))
        out = asyncio.run(e.generate(r))
        assert e.context_length == 32 and len(out.token_ids) == 7 and out.finish_reason == "length"
        ref = e.teacher_forced_logprobs(list(r.prompt_ids), out.token_ids)
        assert max(abs(a - b) for a, b in zip(ref, out.logprobs)) < 1e-4
    finally:
        asyncio.run(e.aclose())


def test_a_request_whose_event_loop_has_closed_is_dropped_quietly(engine):
    """A caller's ``asyncio.run`` may return while the engine still settles its request (a batch
    failed as the caller gave up): settling it must not raise on the compute thread, which every
    engine and trainer of the process shares."""
    from orchestrator.engines.hf import _Seq

    loop = asyncio.new_event_loop()
    seq = _Seq(request=request(engine, 0), future=loop.create_future(), loop=loop, seed=0)
    loop.close()
    engine._fail(seq, RuntimeError("the batch failed"))
    assert len(asyncio.run(gather(engine, [request(engine, 0, max_tokens=3, ignore_eos=True)]))[0].token_ids) == 3


def test_closed_engine_refuses_work(engine):
    asyncio.run(engine.aclose())
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(engine.generate(request(engine, 0)))


def test_stop_strings_given_as_a_list_are_refused_for_being_a_list():
    """docs/engine.md shows ``SamplingParams(..., stop, ...)``: a list of strings was refused as
    "stop must be strings", which they were."""
    with pytest.raises(ValueError, match=r"stop must be a tuple of strings, got \['\\n'\]"):
        SamplingParams(stop=["\n"])
    with pytest.raises(ValueError, match="stop must be a tuple of strings"):
        SamplingParams(stop=("\n", 1))
    assert SamplingParams(stop=("\n", "")).stop == ("\n", "")


@pytest.mark.parametrize("option", ["temperature", "top_p", "max_tokens", "seed", "top_logprobs"])
def test_a_bool_is_no_sampling_number(option):
    """max_tokens=True sampled one token, temperature=True at 1, as a recipe's sampling refuses them."""
    with pytest.raises(ValueError, match=f"^{option} must be .*, got True$"):
        SamplingParams(**{option: True})


def test_a_temperature_float32_cannot_hold_is_refused(engine):
    """The sampler divides float32 logits by it: 1e39 was inf there, a schema's banned tokens NaN,
    and the request failed on a banned token drawn (GrammarError, or serve's 400 blaming the schema)."""
    with pytest.raises(ValueError, match=r"^temperature must be 0 \(greedy\) or a number >= 0.001 .*got 1e\+39$"):
        SamplingParams(temperature=1e39)
    schema = json.dumps({"type": "object", "properties": {"c": {"type": "string"}}, "required": ["c"]})
    r = request(engine, 0, temperature=3e38, max_tokens=16)  # the largest float32s are served
    out = asyncio.run(engine.generate(GenerationRequest(r.prompt_ids, r.sampling, json_schema=schema)))
    assert out.text.startswith('{"c": "') and all(lp <= 0 for lp in out.logprobs)


def test_ignore_eos_must_be_a_bool():
    """ignore_eos="no" is truthy: it sampled past every end of turn."""
    with pytest.raises(ValueError, match="^ignore_eos must be True or False, got 'no'$"):
        SamplingParams(ignore_eos="no")
    assert SamplingParams(ignore_eos=True).ignore_eos is True


def test_adapters_load_from_peft_format_dirs(engine, tmp_path):
    state = lora_state(engine.model, 3, std=0.5)
    assert engine.load_adapter("disk", peft_dir(tmp_path, state, alpha=8)) == 1
    engine.add_adapter("same")
    assert engine.update_adapter("same", state, scale=2.0) == 2  # alpha / r = 8 / 4
    a = asyncio.run(engine.generate(request(engine, 0, adapter="disk", temperature=0.0)))
    b = asyncio.run(engine.generate(request(engine, 0, adapter="same", temperature=0.0)))
    assert a.token_ids == b.token_ids
    with pytest.raises(KeyError, match="does not have"):
        engine.update_adapter("same", {"base_model.model.model.nope.lora_A.weight": torch.zeros(1)})
    # a PEFT adapter with target_modules [..., lm_head] was told the model has no lm_head
    head = {f"base_model.model.lm_head.lora_{part}.weight": torch.zeros(4, 4) for part in "AB"}
    with pytest.raises(ValueError, match="has LoRA on lm_head, which the engine does not compute"):
        engine.update_adapter("same", {**state, **head})


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # PEFT's call, not ours
@pytest.mark.parametrize("rslora", [False, True], ids=["lora", "rslora"])
def test_an_adapter_dir_computes_the_logprobs_peft_computes(tmp_path, rslora):
    """PEFT's forward over the same dir is the reference: its delta scaled by alpha / r (alpha /
    sqrt(r) with use_rslora). Engine paths compared only with each other missed a scale dropped
    from every adapter, or rsLoRA's read as plain LoRA's."""
    from orchestrator.models import load_model
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    reference = load_model("tiny", dtype="float32").model  # the engine's weights (seed 0)
    state = lora_state(reference, 3, std=0.2, modules=("q_proj", "v_proj", "down_proj"))
    folder = peft_dir(tmp_path / "a", state, alpha=12)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "use_rslora": rslora}))
    peft = get_peft_model(reference, LoraConfig(r=4, lora_alpha=12, use_rslora=rslora,
                                                target_modules=["q_proj", "v_proj", "down_proj"]))
    assert not set_peft_model_state_dict(peft, state).unexpected_keys
    engine = tiny_engine()
    try:
        engine.load_adapter("a", folder)
        tokens = list(range(100, 140))
        ours = torch.tensor(engine.teacher_forced_logprobs(tokens[:8], tokens[8:], "a"))
        base = torch.tensor(engine.teacher_forced_logprobs(tokens[:8], tokens[8:]))
        with torch.no_grad():
            logits = peft(input_ids=torch.tensor([tokens[:-1]])).logits[0, 7:]
        theirs = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens[8:])[:, None]).squeeze(-1)
        assert torch.allclose(ours, theirs, atol=1e-4)
        assert (ours - base).abs().max() > 1e-2  # the adapter does change the logprobs
    finally:
        asyncio.run(engine.aclose())


def test_an_adapter_of_another_base_model_is_refused_at_load(engine, tmp_path):
    """Shapes that do not fit would fail every episode later, inside a matmul; modules the model
    lacks (a deeper model's layers) are one line too, not a KeyError."""
    from orchestrator.engines.load import load_engine
    from orchestrator.errors import RolecastError

    state = lora_state(engine.model, 3, std=0.5)
    key = next(k for k in state if k.endswith("lora_A.weight"))
    state[key] = torch.zeros(state[key].shape[0], state[key].shape[1] * 2)  # a wider model's layer
    folder = peft_dir(tmp_path / "other", state)
    with pytest.raises(ValueError, match=r"adapter 'other' does not fit this model .* lora_A is \(4, \d+\)"):
        engine.load_adapter("other", folder)
    with pytest.raises(RolecastError, match=rf"--adapter other={folder}: adapter 'other' does not fit this model"):
        load_engine("tiny", "float32", 0, adapters={"other": folder}, device="cpu")
    state = lora_state(engine.model, 3)
    deeper = {k.replace("layers.1.", "layers.9."): t.clone() for k, t in state.items() if "layers.1." in k}
    folder = peft_dir(tmp_path / "deeper", {**state, **deeper})
    with pytest.raises(RolecastError, match=rf"^--adapter deeper={folder}: adapter 'deeper' targets modules the model "
                                            r"does not have: \['model.layers.9."):
        load_engine("tiny", "float32", 0, adapters={"deeper": folder}, device="cpu")


def test_an_adapter_that_is_not_plain_lora_is_refused_at_load(engine, tmp_path):
    """DoRA, embedding LoRA, modules_to_save, per-module ranks and lora_B biases (lora_bias) loaded as
    plain LoRA (logprobs up to 11 nats off PEFT's), an adapter without LoRA weights as the base model,
    and a .bin-only dir was a FileNotFoundError traceback."""
    import json

    state = lora_state(engine.model, 3, std=0.5)
    key = next(k for k in state if k.endswith("q_proj.lora_A.weight"))
    cases = {
        "dora": ({"use_dora": True}, {}, "uses DoRA"),
        "saved": ({"modules_to_save": ["lm_head"]}, {}, "uses modules_to_save"),
        "ranks": ({"rank_pattern": {"q_proj": 8}}, {}, r"uses per-module ranks \(rank_pattern\)"),
        "embed": ({}, {"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(4, 8)},
                  r"not LoRA A/B on a linear layer \(base_model.model.model.embed_tokens.lora_embedding_A, 1 in all\)"),
        "bias": ({"lora_bias": True}, {key.replace("lora_A.weight", "lora_B.bias"): torch.ones(64)},
                 r"not LoRA A/B on a linear layer \(.*q_proj.lora_B.bias, 1 in all\)"),
    }
    for name, (config, extra, words) in cases.items():
        folder = peft_dir(tmp_path / name, {**state, **extra})
        written = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**written, **config}))
        with pytest.raises(ValueError, match=words):
            engine.load_adapter(name, folder)
    folder = peft_dir(tmp_path / "bin", state)
    (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")
    with pytest.raises(ValueError, match=r"adapter_model.bin: not a torch file of tensors \(UnpicklingError\)"):
        engine.load_adapter("bin", folder)
    (folder / "adapter_model.bin").unlink()
    with pytest.raises(ValueError, match=r"no adapter_model.safetensors \(or .bin\) in"):
        engine.load_adapter("bin", folder)


def test_an_adapter_saved_as_adapter_model_bin_serves_as_its_safetensors_twin(tmp_path, engine):
    """Older PEFT saved adapter_model.bin: `--adapter` took the dir (as vLLM does), then the HF engine
    refused it after the model had loaded."""
    state = lora_state(engine.model, 3, std=0.5)
    engine.load_adapter("safe", peft_dir(tmp_path / "safe", state))
    folder = peft_dir(tmp_path / "bin", state)
    (folder / "adapter_model.safetensors").unlink()
    torch.save(state, folder / "adapter_model.bin")
    engine.load_adapter("bin", folder)
    safe, old = (asyncio.run(engine.generate(request(engine, 0, adapter=a))) for a in ("safe", "bin"))
    assert old.token_ids == safe.token_ids and old.logprobs == pytest.approx(safe.logprobs)
    torch.save([t for t in state.values()], folder / "adapter_model.bin")  # a list, not named tensors
    with pytest.raises(ValueError, match="adapter_model.bin: not a mapping of names to tensors"):
        engine.load_adapter("list", folder)
    torch.save({k: t.tolist() for k, t in state.items()}, folder / "adapter_model.bin")  # named, but lists
    with pytest.raises(ValueError, match="adapter_model.bin: not a mapping of names to tensors"):
        engine.load_adapter("lists", folder)


def test_an_adapter_whose_config_misstates_rank_or_alpha_is_one_line_at_load(tmp_path):
    """r 0, null or a string was a traceback out of ``rolecast run --adapter``; r 8 on rank-4 weights,
    or a negative r, scaled the delta wrong (PEFT refuses both dirs), and lora_alpha 0 served the
    base model under the adapter's name."""
    import json

    from orchestrator.engines.load import load_engine
    from orchestrator.errors import RolecastError
    from orchestrator.models import load_model

    state = lora_state(load_model("tiny").model, 3)  # rank 4
    cases = {"zero": ({"r": 0}, "says r 0, its lora_A weights have rank 4"),
             "text": ({"r": "4"}, "says r '4', its lora_A"), "other": ({"r": 8}, "says r 8, its lora_A"),
             "negative": ({"r": -4}, "says r -4, its lora_A"), "none": ({}, r"says no r \(PEFT's default: 8\), its"),
             "alpha": ({"r": 4, "lora_alpha": 0}, "says lora_alpha 0: a number above 0"),
             "alpha_null": ({"r": 4, "lora_alpha": None}, "says lora_alpha None: a number above 0")}
    for name, (config, words) in cases.items():
        folder = peft_dir(tmp_path / name, state)
        (folder / "adapter_config.json").write_text(json.dumps(config))
        with pytest.raises(RolecastError, match=rf"--adapter {name}={folder}: its adapter_config.json {words}"):
            load_engine("tiny", "float32", 0, adapters={name: folder}, device="cpu")


def test_an_adapter_config_whose_numbers_are_bools_or_infinite_or_with_no_weights_is_refused():
    """True is 1 to Python, and JSON's Infinity reads as inf: r true and lora_alpha true passed as
    numbers, an infinite alpha as a scale (NaN logits); a dir with no weights said its lora_A
    weights had rank '' (of none)."""
    import math

    from orchestrator.engines.lora import check_plain_lora, check_rank_and_alpha

    for config, words in (({"r": True}, "says r True, its lora_A weights have rank 1:"),
                          ({"r": 1, "lora_alpha": True}, "says lora_alpha True: a number above 0"),
                          ({"r": 1, "lora_alpha": math.inf}, "says lora_alpha inf: a number above 0")):
        with pytest.raises(ValueError, match=words):
            check_rank_and_alpha(config, {1})
    with pytest.raises(ValueError, match="^the adapter holds no LoRA weights$"):
        check_plain_lora({"r": 4}, {})


def test_an_adapter_whose_lora_a_and_lora_b_disagree_is_refused_at_load(tmp_path):
    """A lora_B of another rank than its lora_A or of another width than its layer loaded, and
    every request on the adapter failed later, building its stack; a lora_A with no dimensions was
    an IndexError out of the rank check."""
    engine = tiny_engine()
    state = lora_state(engine.model, 3)  # rank 4
    q_b = next(k for k in state if k.endswith("q_proj.lora_B.weight"))
    last_a = [k for k in state if k.endswith("lora_A.weight")][-1]
    cases = {"rank": {q_b: torch.ones(state[q_b].shape[0], 8)},
             "width": {q_b: torch.ones(2 * state[q_b].shape[0], 4)},
             "scalar": {last_a: torch.tensor(1.0)}}
    try:
        for name, bad in cases.items():
            with pytest.raises(ValueError, match=f"adapter '{name}' does not fit this model"):
                engine.load_adapter(name, peft_dir(tmp_path / name, {**state, **bad}))
    finally:
        asyncio.run(engine.aclose())


def test_an_adapter_whose_modules_differ_in_rank_samples_as_its_zero_padded_twin(engine):
    """``update_adapter`` takes a rank per module (a module's lower rank pads the adapter's stack
    with zeros): served beside the same weights padded to one rank, it samples what they sample."""
    ragged = lora_state(engine.model, 3, std=0.5)  # rank 4; q_proj's cut to 2 below
    padded = dict(ragged)
    for a in [k for k in ragged if k.endswith("q_proj.lora_A.weight")]:
        b = a.replace("lora_A", "lora_B")
        ragged[a], ragged[b] = ragged[a][:2], ragged[b][:, :2]
        padded[a] = torch.cat([ragged[a], torch.zeros_like(ragged[a])])
        padded[b] = torch.cat([ragged[b], torch.zeros_like(ragged[b])], dim=1)
    for name, state in (("ragged", ragged), ("padded", padded)):
        engine.add_adapter(name)
        engine.update_adapter(name, state)
    outs = asyncio.run(gather(engine, [request(engine, 1, adapter=name) for name in ("ragged", "padded")]))
    assert_same_draws([(outs[0].token_ids, outs[0].logprobs)], [(outs[1].token_ids, outs[1].logprobs)])


def test_an_adapter_whose_weights_file_is_cut_short_is_one_line_at_load(tmp_path):
    """safetensors' own error came out of ``rolecast run --adapter`` as a traceback."""
    from orchestrator.engines.load import load_engine
    from orchestrator.errors import RolecastError
    from orchestrator.models import load_model

    folder = peft_dir(tmp_path / "cut", lora_state(load_model("tiny").model, 3))
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(RolecastError, match=rf"--adapter cut={folder}: cannot read {weights}: "):
        load_engine("tiny", "float32", 0, adapters={"cut": folder}, device="cpu")


@pytest.mark.parametrize("static", [False, True])
def test_an_adapter_removed_and_added_again_never_serves_the_old_weights_keys(static):
    """Versions key the prefix cache: a removed adapter's numbers are not used again, and a row
    whose adapter changed while it ran (keys from two sets of weights) is not cached."""
    e = tiny_engine(max_batch=8, max_prefill=3, static=static)
    e.add_adapter("a")
    randomize(e, "a", 1)  # version 2
    prompt = tuple(e.apply_chat_template([{"role": "user", "content": "Tell me a story about a fox near the river."}]))

    async def swap_while_it_runs():
        running = asyncio.create_task(e.generate(GenerationRequest(prompt, SamplingParams(max_tokens=40, seed=1), "a")))
        while not e._active:
            await asyncio.sleep(0.001)
        with e._lock:  # as the trainer's thread does, between two engine steps
            e.remove_adapter("a")
            e.add_adapter("a")
            version = randomize(e, "a", 2)
        await running
        return version

    try:
        assert asyncio.run(swap_while_it_runs()) == 4  # on from the removed adapter's 2: no number is used twice
        hits = e.stats.prefix_hit_tokens
        out = asyncio.run(e.generate(GenerationRequest(prompt, SamplingParams(max_tokens=8, seed=5), "a")))
        assert e.stats.prefix_hit_tokens == hits  # nothing cached from the row that ran across the swap
        reference = e.teacher_forced_logprobs(list(prompt), out.token_ids, "a", 1.0)
        assert max(abs(a - b) for a, b in zip(reference, out.logprobs)) < 1e-4
    finally:
        asyncio.run(e.aclose())


def test_a_request_whose_grammar_compiles_while_the_engine_closes_fails_at_once(monkeypatch):
    """It was queued after aclose had emptied the queue, and waited forever."""
    import time

    from orchestrator.engines.hf import HFEngine

    engine = tiny_engine()
    compile_row = HFEngine._constrained_row

    def slow(self, req):
        time.sleep(0.5)
        return compile_row(self, req)

    monkeypatch.setattr(HFEngine, "_constrained_row", slow)
    schema = '{"properties": {"a": {"type": "integer"}}, "required": ["a"], "type": "object"}'
    req = GenerationRequest(tuple(engine.encode("hi")), SamplingParams(max_tokens=4, seed=0), json_schema=schema)

    async def race():
        pending = asyncio.create_task(engine.generate(req))
        await asyncio.sleep(0.1)  # inside the compile
        await engine.aclose()
        return await asyncio.wait_for(pending, timeout=30)

    with pytest.raises(RuntimeError, match="the engine is closed"):
        asyncio.run(race())
