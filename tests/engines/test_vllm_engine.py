"""The vLLM backend up to the vLLM calls, against a fake ``vllm`` (no GPU or vllm here).

What is checked: the missing/old-vllm errors, engine and sampling parameters, logprob and
finish-reason extraction, a fresh LoRA name and id per adapter version (and eviction of the old
one once unused), snapshots of adapter dirs, update_adapter's PEFT dir, abort on cancel.
"""
from __future__ import annotations

import asyncio
import errno
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

import fake_vllm
from fake_vllm import Reply
from sandboxes.pool import scratch_root
from orchestrator.config import SamplingConfig
from orchestrator.engines.base import Engine, GenerationRequest, RequestRefused, SamplingParams
from orchestrator.grammar.schema import grammar_after
from orchestrator.messages import parse_message
from orchestrator.models import checkpoint_dir
from orchestrator.policies.base import PolicyRequest
from orchestrator.policies.engine import EnginePolicy
from orchestrator.role import LIBRARY_DIR, load_role


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(checkpoint_dir(), local_files_only=True)


@pytest.fixture
def vllm_engine(monkeypatch, tokenizer):
    fake_vllm.install(monkeypatch)
    from orchestrator.engines.vllm import VLLMEngine

    engine = VLLMEngine("/models/base", tokenizer=tokenizer, max_loras=4, max_lora_rank=32)
    yield engine
    asyncio.run(engine.aclose())  # else each run of this file left its snapshot folders in /tmp


def fake(engine) -> fake_vllm.AsyncLLMEngine:
    [llm] = fake_vllm.AsyncLLMEngine.engines
    return llm


def adapter_dir(folder: Path, value: float, rank: int = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.full((rank, 8), value),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.full((8, rank), value)},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj"]}))
    return folder


def req(adapter=None, **sampling) -> GenerationRequest:
    return GenerationRequest((1, 2, 3), SamplingParams(**{"temperature": 0.7, "max_tokens": 20, **sampling}), adapter)


def test_missing_vllm_says_how_to_install(monkeypatch, tokenizer):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    from orchestrator.engines.vllm import VLLMEngine, VLLMUnavailable

    with pytest.raises(VLLMUnavailable, match=r"pip install 'rolecast\[vllm\]'"):
        VLLMEngine("/models/base", tokenizer=tokenizer)


def test_too_old_vllm_names_the_minimum_version(monkeypatch, tokenizer):
    fake_vllm.install(monkeypatch, structured_outputs=False)
    from orchestrator.engines.vllm import MIN_VERSION, VLLMEngine, VLLMUnavailable

    with pytest.raises(VLLMUnavailable, match=rf"vllm 0\.9\.2-fake is too old .*vllm>={MIN_VERSION}"):
        VLLMEngine("/models/base", tokenizer=tokenizer)


def test_engine_args_enable_multi_lora_and_processed_logprobs(vllm_engine):
    args = fake(vllm_engine).args
    assert isinstance(vllm_engine, Engine)
    assert (args.model, args.enable_lora, args.max_loras, args.max_lora_rank) == ("/models/base", True, 4, 32)
    assert args.logprobs_mode == "processed_logprobs" and args.enable_prefix_caching is True


async def test_sampling_params_mapping(vllm_engine, tokenizer):
    await vllm_engine.generate(req(temperature=0.3, top_p=0.9, max_tokens=7, stop=("END", "", "\n\n"), seed=42))
    p = fake(vllm_engine).calls[-1].params
    assert (p.n, p.temperature, p.top_p, p.max_tokens, p.seed) == (1, 0.3, 0.9, 7, 42)
    assert p.stop == ["END", "\n\n"]  # vLLM rejects empty stop strings
    assert p.logprobs == 0  # the sampled token's logprob only
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in p.stop_token_ids  # end of turn, as in the HF engine
    assert p.output_kind.name == "FINAL_ONLY" and p.structured_outputs is None
    assert fake(vllm_engine).calls[-1].prompt == {"prompt_token_ids": [1, 2, 3]}
    await vllm_engine.generate(req(max_tokens=7, ignore_eos=True))
    p = fake(vllm_engine).calls[-1].params
    assert p.ignore_eos is True and not p.stop_token_ids  # no end of turn either: a fixed length


async def test_a_temperature_vllm_would_raise_is_refused(vllm_engine):
    """vLLM samples 0 < T < 0.01 at 0.01: the recorded logprobs would not be those the trainer replays at T."""
    with pytest.raises(ValueError, match="temperature 0 .greedy. or at least 0.01"):
        await vllm_engine.generate(req(temperature=0.005))
    assert not fake(vllm_engine).calls and vllm_engine.busy == 0
    await vllm_engine.generate(req(temperature=0.01))
    assert fake(vllm_engine).calls[-1].params.temperature == 0.01


def test_the_fake_refuses_what_vllm_refuses():
    """Else a backend bug that real vLLM would reject passes here."""
    with pytest.raises(ValueError, match="empty string"):
        fake_vllm.SamplingParams(stop=["END", ""])
    with pytest.raises(ValueError, match="top_p"):
        fake_vllm.SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        fake_vllm.SamplingParams(max_tokens=0)
    assert fake_vllm.SamplingParams(temperature=0.005).temperature == 0.01  # raised, not refused
    with pytest.raises(ValueError, match="id must be > 0"):
        fake_vllm.LoRARequest("coder@v1", 0, "/snapshots/coder")
    with pytest.raises(AssertionError, match="lora_path"):
        fake_vllm.LoRARequest("coder@v1", 1)
    with pytest.raises(ValueError, match="one kind"):
        fake_vllm.StructuredOutputsParams(json="{}", grammar="root ::= \"x\"")
    with pytest.raises(ValueError, match="max_lora_rank"):
        fake_vllm.AsyncLLMEngine.from_engine_args(fake_vllm.AsyncEngineArgs("/models/base", enable_lora=True,
                                                                           max_lora_rank=100))


async def test_json_schema_goes_to_structured_outputs_as_the_hf_engines_grammar(vllm_engine):
    schema = json.dumps({"type": "object", "properties": {"verdict": {"enum": ["approve", "reject"]}}})
    fake(vllm_engine).reply = Reply([5, 6], [-0.1, -0.2], '{"verdict": "reject"}')
    await vllm_engine.generate(GenerationRequest((1, 2), SamplingParams(), None, json_schema=schema))
    structured = fake(vllm_engine).calls[-1].params.structured_outputs
    assert structured.grammar == grammar_after(schema) and structured.json is None
    fake(vllm_engine).reply = Reply([5, 6], [-0.1, -0.2], '{"verdict":"reject"}')  # loose JSON: not the tight grammar
    with pytest.raises(ValueError, match="does not allow"):
        await vllm_engine.generate(GenerationRequest((1, 2), SamplingParams(), None, json_schema=schema))


def policy_request(role: str, prefix: str = "", schema: str | None = None) -> PolicyRequest:
    return PolicyRequest(role=role, episode="e", episode_index=0, turn=0, attempt=0,
                         messages=[{"role": "user", "content": "Say something."}], context={},
                         sampling=SamplingConfig(), adapter=None, seed=9, json_schema=schema, reply_prefix=prefix)


async def test_engine_policy_passes_the_roles_schema_through(vllm_engine):
    schema = json.dumps({"type": "object", "properties": {"say": {"type": "string"}}, "required": ["say"]})
    fake(vllm_engine).reply = Reply([5], [-0.1], '{"say": "hi"}')
    request = policy_request("echo", schema=schema)
    out = await EnginePolicy(vllm_engine)(request)
    call = fake(vllm_engine).calls[-1]
    assert call.params.structured_outputs.grammar == grammar_after(schema) and call.params.seed == 9
    assert out.json_schema == schema  # the tokens' logprobs are of the masked distribution: training reads it
    assert call.prompt["prompt_token_ids"] == out.prompt_ids == vllm_engine.apply_chat_template(request.messages)


async def test_engine_policy_samples_with_the_roles_options_seed_and_adapter(vllm_engine, tmp_path):
    vllm_engine.load_adapter("coder", adapter_dir(tmp_path / "coder", 1.0))
    fake(vllm_engine).reply = Reply([5, 6], [-0.1, -0.2], "hi", "length")
    request = replace(policy_request("coder"), adapter="coder", seed=42,
                      sampling=SamplingConfig(temperature=0.3, top_p=0.9, max_tokens=7, stop=["END"]))
    out = await EnginePolicy(vllm_engine)(request)
    call = fake(vllm_engine).calls[-1]
    p = call.params
    assert (p.temperature, p.top_p, p.max_tokens, p.stop, p.seed) == (0.3, 0.9, 7, ["END"], 42)
    assert call.lora_request.lora_name.startswith("coder") and (out.adapter, out.adapter_version) == ("coder", 1)
    assert (out.text, out.token_ids, out.logprobs, out.finish_reason) == ("hi", [5, 6], [-0.1, -0.2], "length")


@pytest.mark.parametrize("name,rest", [
    ("reviewer", 'approve", "comments": ["Looks right."]}'),
    ("coder", 'src/util.py", "search": "a\\nb", "replace": "c"}]}'),
    ("number_guesser", "512}"),
])
async def test_a_library_role_keeps_its_reply_prefix_on_vllm(vllm_engine, name, rest):
    """The prefix sits in the prompt; vLLM is constrained to what follows it, so the role reads and
    validates exactly as on the HF engine."""
    role = load_role(LIBRARY_DIR / f"{name}.yaml")
    prefix = role.config.reply_prefix
    assert prefix
    fake(vllm_engine).reply = Reply([5, 6], [-0.1, -0.2], rest)
    request = policy_request(name, prefix, role.json_schema)
    out = await EnginePolicy(vllm_engine)(request)
    call = fake(vllm_engine).calls[-1]
    assert call.prompt["prompt_token_ids"] == vllm_engine.apply_chat_template(request.messages) + vllm_engine.encode(prefix)
    assert out.text == prefix + rest
    content, errors = parse_message(out.text, role.validator)
    assert content is not None and errors == []
    fake(vllm_engine).reply = Reply([5, 6], [-0.1, -0.2], prefix + rest)  # the whole message again after the prefix
    with pytest.raises(ValueError, match="does not allow"):
        await EnginePolicy(vllm_engine)(request)


async def test_logprobs_are_the_sampled_tokens(vllm_engine):
    fake(vllm_engine).reply = Reply([40, 41, 42], [-1.5, -0.75, -0.1], "abc", "length")
    out = await vllm_engine.generate(req())
    assert out.token_ids == [40, 41, 42] and out.text == "abc"
    assert out.logprobs == [-1.5, -0.75, -0.1]  # not the runner-up candidates the fake also returns
    assert out.finish_reason == "length" and (out.adapter, out.adapter_version) == (None, 0)


async def test_top_logprobs_are_vllms_ranks_one_to_n(vllm_engine):
    """serve's top_logprobs: vLLM returns the sampled token whatever its rank, and the N best."""
    fake(vllm_engine).reply = Reply([40, 41], [-1.5, -0.75], "ab", "length")
    out = await vllm_engine.generate(req(top_logprobs=2))
    assert fake(vllm_engine).calls[-1].params.logprobs == 2
    assert out.top_logprobs == [[(40, -1.5), (41, -2.5)], [(41, -0.75), (42, -1.75)]] and out.logprobs == [-1.5, -0.75]
    assert (await vllm_engine.generate(req(top_logprobs=1))).top_logprobs == [[(40, -1.5)], [(41, -0.75)]]
    assert (await vllm_engine.generate(req())).top_logprobs is None and fake(vllm_engine).calls[-1].params.logprobs == 0


async def test_a_token_that_completes_two_stop_strings_cuts_the_text_at_the_first(vllm_engine, tokenizer):
    """vLLM's detokenizer cuts at the first stop string listed that a step completed ("re" in " there"),
    not at the earliest in the text ("th"): the reply kept a stop string. The HF engine cuts at "th"."""
    ids = tokenizer.encode("Hi there", add_special_tokens=False)
    assert len(ids) == 2  # " there" is one token: it completes both stop strings
    fake(vllm_engine).reply = Reply(ids, [-0.5, -0.25], "Hi the", "stop", "re")  # as vLLM answers
    out = await vllm_engine.generate(req(stop=("re", "th")))
    assert (out.text, out.finish_reason, out.token_ids) == ("Hi ", "stop", ids)


@pytest.mark.parametrize("reason, stop_reason, expected", [
    ("stop", "END", "stop"),  # a stop string
    ("stop", None, "eos"),  # the model's EOS
    ("stop", 2, "eos"),  # one of stop_token_ids (<|im_end|>)
    ("length", None, "length"),
    ("abort", None, "cancelled"),
])
async def test_finish_reasons(vllm_engine, reason, stop_reason, expected):
    fake(vllm_engine).reply = Reply([5, 6], [-0.2, -0.3], "x", reason, stop_reason)
    assert (await vllm_engine.generate(req())).finish_reason == expected


async def test_missing_logprobs_is_an_error(vllm_engine):
    def no_logprobs(call):
        return Reply([5], [-0.1], "x")

    llm = fake(vllm_engine)
    llm.reply = no_logprobs
    original = llm.generate

    async def stripped(*args, **kwargs):
        async for out in original(*args, **kwargs):
            out.outputs[0].logprobs = None
            yield out

    llm.generate = stripped
    with pytest.raises(RuntimeError, match="no logprobs"):
        await vllm_engine.generate(req())
    assert vllm_engine.busy == 0


def test_logprob_steps_must_match_the_tokens_one_for_one():
    """A step more or fewer than the tokens would shift every logprob onto another token."""
    from orchestrator.engines.vllm import sampled_logprobs

    steps = [{5: fake_vllm.Logprob(-0.1, 1)}, {6: fake_vllm.Logprob(-0.2, 1)}]
    assert sampled_logprobs(steps, [5, 6]) == [-0.1, -0.2]
    for tokens in ([5], [5, 6, 7]):
        with pytest.raises(RuntimeError, match=f"2 logprob steps for {len(tokens)} tokens"):
            sampled_logprobs(steps, tokens)


def test_top_logprobs_leave_out_the_tokens_a_grammar_bans():
    """vLLM ranks the -inf logprobs of banned tokens too: they are no alternatives."""
    from orchestrator.engines.vllm import most_likely

    step = {5: fake_vllm.Logprob(-0.1, 1), 6: fake_vllm.Logprob(float("-inf"), 2), 7: fake_vllm.Logprob(-3.0, 3)}
    assert most_likely(step, 2) == [(5, -0.1)] and most_likely(step, 3) == [(5, -0.1), (7, -3.0)]


def with_outputs(llm, outputs):
    """Make ``llm`` answer every request with these RequestOutputs, in place of its scripted reply."""
    async def generate(prompt, params, request_id, *, lora_request=None):
        for out in outputs:
            yield out

    llm.generate = generate


@pytest.mark.parametrize("outputs", [[], [fake_vllm.RequestOutput("r", [1, 2, 3], [], True)]])
async def test_a_request_vllm_answers_with_no_output_is_an_error(vllm_engine, outputs):
    with_outputs(fake(vllm_engine), outputs)
    with pytest.raises(RuntimeError, match="vllm returned no output for request rolecast-0"):
        await vllm_engine.generate(req())
    assert vllm_engine.busy == 0


async def test_a_prompt_vllm_refuses_is_a_refused_request(vllm_engine):
    """vLLM's own check as the request is added: the caller's to fix, not an engine failure."""
    fake(vllm_engine).args.max_model_len = 2
    with pytest.raises(RequestRefused, match="longer than the maximum model length of 2"):
        await vllm_engine.generate(req())
    assert vllm_engine.busy == 0


async def test_an_adapter_named_like_a_path_is_snapshotted_inside_the_engines_folder(vllm_engine, tmp_path):
    """serve takes any --adapter NAME: ../../x copied the adapter to /x-XXXX, outside the snapshots
    the engine removes as it closes, and a/b was a FileNotFoundError traceback."""
    source = adapter_dir(tmp_path / "judge", 1.0)
    for name in ("../../escaped", "org/judge"):
        assert vllm_engine.load_adapter(name, source) == 1
        await vllm_engine.generate(req(name))
    for call in fake(vllm_engine).calls:
        assert Path(call.lora_request.lora_path).parent == vllm_engine._snapshots


async def test_each_version_gets_a_new_lora_name_id_and_snapshot(vllm_engine, tmp_path):
    source = adapter_dir(tmp_path / "sampler" / "coder", 1.0)
    assert vllm_engine.load_adapter("coder", source) == 1
    first = await vllm_engine.generate(req("coder"))
    adapter_dir(source, 2.0)  # the trainer rewrites the sampler dir in place
    assert vllm_engine.load_adapter("coder", source) == 2
    second = await vllm_engine.generate(req("coder"))
    a, b = (c.lora_request for c in fake(vllm_engine).calls)
    assert (first.adapter_version, second.adapter_version) == (1, 2)
    # Prefix-cache blocks are keyed by the LoRA's name (vLLM >= 0.11.1) or int id (before): both must change.
    assert a.lora_name != b.lora_name and a.lora_int_id != b.lora_int_id
    assert a.lora_name.startswith("coder") and b.lora_name.startswith("coder")
    assert Path(b.lora_path) != source
    weights = load_file(str(Path(b.lora_path) / "adapter_model.safetensors"))
    assert torch.all(next(iter(weights.values())) == 2.0)


def test_an_adapter_above_max_lora_rank_is_refused_when_loaded(vllm_engine, tmp_path):
    """vLLM would refuse it only when a request loads it, inside its engine core."""
    with pytest.raises(ValueError, match="LoRA rank 64 is above the vllm engine's max_lora_rank 32"):
        vllm_engine.load_adapter("coder", adapter_dir(tmp_path / "wide", 1.0, rank=64))
    assert vllm_engine.adapter_version("coder") == 0
    assert vllm_engine.load_adapter("coder", adapter_dir(tmp_path / "narrow", 1.0, rank=32)) == 1


@pytest.mark.parametrize("lora_rank, adapter_rank, engine_rank", [
    (0, None, 64),  # serve's and eval's default: room for the common ranks
    (16, None, 64),
    (128, None, 128),  # a recipe's lora.rank: 128 (its first update would have been refused at 64)
    (100, None, 128),  # vLLM takes only some ranks
    (0, 300, 320),  # an --adapter dir's rank
])
def test_load_engine_sizes_vllms_lora_slots_for_the_ranks_it_will_serve(monkeypatch, tmp_path, lora_rank,
                                                                          adapter_rank, engine_rank):
    from orchestrator.engines.load import load_engine

    fake_vllm.install(monkeypatch)
    adapters = {"coder": adapter_dir(tmp_path / "coder", 1.0, rank=adapter_rank)} if adapter_rank else None
    engine = load_engine(str(checkpoint_dir()), backend="vllm", adapters=adapters, lora_rank=lora_rank)
    assert fake(engine).args.max_lora_rank == engine_rank == engine.max_lora_rank
    asyncio.run(engine.aclose())


def test_a_rank_above_vllms_largest_is_one_line(monkeypatch, tmp_path):
    from orchestrator.engines.load import load_engine
    from orchestrator.errors import RolecastError

    fake_vllm.install(monkeypatch)
    with pytest.raises(RolecastError, match="--engine vllm: LoRA rank 600 is above vLLM's largest max_lora_rank, 512"):
        load_engine(str(checkpoint_dir()), backend="vllm", adapters={"c": adapter_dir(tmp_path / "c", 1.0, rank=600)})


def test_an_engine_or_device_load_engine_cannot_serve_is_one_line(monkeypatch):
    """load_engine's own checks, for callers past the CLI's (a rollout worker's, the Python API's):
    vLLM places itself on the GPUs it sees, so --device cpu would have been ignored."""
    from orchestrator.engines.load import load_engine
    from orchestrator.errors import RolecastError

    fake_vllm.install(monkeypatch)
    with pytest.raises(RolecastError, match="^--engine vllm runs on a CUDA GPU, not --device cpu$"):
        load_engine(str(checkpoint_dir()), backend="vllm", device="cpu")
    with pytest.raises(RolecastError, match="^unknown engine 'vLLM': use one of hf, vllm$"):
        load_engine("tiny", backend="vLLM")


async def test_superseded_version_is_evicted_once_unused(vllm_engine, tmp_path):
    vllm_engine.load_adapter("judge", adapter_dir(tmp_path / "j1", 1.0))
    llm = fake(vllm_engine)
    llm.hang = True
    running = asyncio.create_task(vllm_engine.generate(req("judge")))
    await asyncio.sleep(0.05)
    old = llm.calls[-1].lora_request
    vllm_engine.load_adapter("judge", adapter_dir(tmp_path / "j2", 2.0))
    await asyncio.sleep(0.05)
    assert llm.removed == [] and Path(old.lora_path).exists()  # still sampling with v1
    llm.hang = False
    assert (await running).adapter_version == 1
    await asyncio.sleep(0.05)
    assert llm.removed == [old.lora_int_id] and not Path(old.lora_path).exists()


def test_a_version_superseded_before_any_request_has_its_snapshot_removed(vllm_engine, tmp_path):
    """No event loop to tell vLLM on, and nothing for it to forget: else each reload's copy stayed until aclose."""
    for value in (1.0, 2.0, 3.0):
        vllm_engine.load_adapter("judge", adapter_dir(tmp_path / "j", value))
    [snapshot] = vllm_engine._snapshots.iterdir()
    assert fake(vllm_engine).removed == []
    assert snapshot == Path(vllm_engine._current["judge"].lora.lora_path)


async def test_aclose_waits_for_the_evictions_under_way(vllm_engine, tmp_path):
    """Else vLLM was shut down first, and the removal ran against a closed engine, or never."""
    vllm_engine.load_adapter("judge", adapter_dir(tmp_path / "j1", 1.0))
    await vllm_engine.generate(req("judge"))
    llm = fake(vllm_engine)
    old = llm.calls[-1].lora_request
    removed_before_shutdown = []
    llm.shutdown = lambda: removed_before_shutdown.extend(llm.removed)
    vllm_engine.load_adapter("judge", adapter_dir(tmp_path / "j2", 2.0))  # its eviction is queued on this loop
    await vllm_engine.aclose()
    assert removed_before_shutdown == [old.lora_int_id]


async def test_an_adapter_without_weights_superseded_has_nothing_to_evict(vllm_engine):
    """add_adapter's version 1 has no LoRA in vLLM: its eviction failed on vLLM's loop, and aclose raised it."""
    vllm_engine.add_adapter("tester")
    await vllm_engine.generate(req("tester"))
    state = {"m.q_proj.lora_A.weight": torch.zeros(4, 8), "m.q_proj.lora_B.weight": torch.zeros(8, 4)}
    assert vllm_engine.update_adapter("tester", state) == 2
    await vllm_engine.aclose()
    assert fake(vllm_engine).removed == []


async def test_reload_from_the_trainers_thread_evicts_on_vllms_loop(vllm_engine, tmp_path):
    vllm_engine.load_adapter("pro", adapter_dir(tmp_path / "p1", 1.0))
    await vllm_engine.generate(req("pro"))
    old = fake(vllm_engine).calls[-1].lora_request
    assert await asyncio.to_thread(vllm_engine.load_adapter, "pro", adapter_dir(tmp_path / "p2", 2.0)) == 2
    await asyncio.sleep(0.05)
    assert fake(vllm_engine).removed == [old.lora_int_id]


async def test_cancel_aborts_the_vllm_request(vllm_engine):
    llm = fake(vllm_engine)
    llm.hang = True
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(vllm_engine.generate(req()), 0.1)
    assert llm.aborted == [llm.calls[-1].request_id]
    assert vllm_engine.busy == 0


async def test_update_adapter_writes_a_peft_dir(vllm_engine, tmp_path):
    vllm_engine.add_adapter("tester")
    await vllm_engine.generate(req("tester"))
    assert fake(vllm_engine).calls[-1].lora_request is None  # B = 0: the base model, no LoRA slot used
    state = {"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight": torch.randn(4, 8),
             "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight": torch.randn(8, 4),
             "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight": torch.randn(4, 8),
             "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight": torch.randn(16, 4)}
    assert vllm_engine.update_adapter("tester", state, scale=2.0) == 2
    out = await vllm_engine.generate(req("tester"))
    path = Path(fake(vllm_engine).calls[-1].lora_request.lora_path)
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["up_proj", "v_proj"])
    saved = load_file(str(path / "adapter_model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in state.items())
    assert out.adapter_version == 2
    with pytest.raises(KeyError, match="add or load it first"):
        vllm_engine.update_adapter("nobody", state)
    # in the process's scratch, which the next process removes where this one was killed
    assert path.parent.parent == scratch_root()


def test_a_full_disk_writing_an_adapter_names_its_file(small_disk):
    """safetensors' save_file failed as SafetensorError('I/O error: No space left'), naming no file."""
    from orchestrator.engines.vllm import write_peft_adapter

    state = {"m.q_proj.lora_A.weight": torch.zeros(8, 1024), "m.q_proj.lora_B.weight": torch.zeros(1024, 8)}
    with pytest.raises(OSError) as raised:
        write_peft_adapter(small_disk / "a", state, 1.0)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(small_disk / "a" / "adapter_model.safetensors"))


def test_a_state_dict_without_lora_a_weights_is_refused_clearly(tmp_path):
    from orchestrator.engines.vllm import write_peft_adapter

    with pytest.raises(ValueError, match="expected lora_A weights of one rank, found ranks none"):
        write_peft_adapter(tmp_path / "a", {"m.q_proj.lora_B.weight": torch.zeros(8, 4)}, 1.0)
    assert not (tmp_path / "a").exists()


async def test_remove_and_unknown_adapters_sample_the_base_model(vllm_engine, tmp_path):
    vllm_engine.load_adapter("con", adapter_dir(tmp_path / "c", 1.0))
    vllm_engine.remove_adapter("con")
    out = await vllm_engine.generate(req("con"))
    assert fake(vllm_engine).calls[-1].lora_request is None and out.adapter_version == 0
    assert vllm_engine.adapter_version("con") == 0
    with pytest.raises(KeyError):
        vllm_engine.remove_adapter("con")
    with pytest.raises(FileNotFoundError, match="not a PEFT adapter dir"):
        vllm_engine.load_adapter("con", tmp_path)


async def test_aclose_shuts_vllm_down_and_refuses_new_requests(vllm_engine):
    await vllm_engine.aclose()
    assert fake(vllm_engine).shut and not vllm_engine._snapshots.exists()
    with pytest.raises(RuntimeError, match="closed"):
        await vllm_engine.generate(req())


def test_cli_runs_a_team_on_the_vllm_engine(monkeypatch, workspace, tmp_path, cli):
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm.AsyncLLMEngine, "default_reply", Reply([11, 12, 2], [-0.5, -0.25, -0.125], '{"say": "hi"}'))
    out_dir = tmp_path / "run"
    code, _, err = cli("run", workspace / "team.yaml", "--engine", "vllm", "--policy", "reviewer=builtin:stub",
                       "--episodes", "2", "--no-progress", "--out", out_dir)
    assert code == 0, err
    [llm] = fake_vllm.AsyncLLMEngine.engines
    assert llm.args.model == str(checkpoint_dir()) and llm.shut  # closed when the run ended
    assert {(c.params.temperature, c.params.max_tokens) for c in llm.calls} == {(0.0, 16)}  # the echo role's sampling
    episodes = [json.loads(line) for line in (out_dir / "transcripts.jsonl").read_text().splitlines()]
    echo = [a for e in episodes for t in e["turns"] if t["role"] == "echo" for a in t["attempts"]]
    assert len(echo) == len(llm.calls) >= 2
    assert all(a["token_ids"] == [11, 12, 2] and a["logprobs"] == [-0.5, -0.25, -0.125] for a in echo)


def test_cli_without_vllm_is_one_line_and_exit_2(monkeypatch, workspace, cli):
    monkeypatch.setitem(sys.modules, "vllm", None)
    code, _, err = cli("run", workspace / "team.yaml", "--engine", "vllm", "--no-progress")
    assert code == 2 and "pip install 'rolecast[vllm]'" in err and "Traceback" not in err
