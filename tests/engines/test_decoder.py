"""The engine's fused decode step gives transformers' logits, with mixed adapters, for each family it takes."""
from __future__ import annotations

import asyncio

import pytest
import torch
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.engines.decoder import FusedDecoder
from orchestrator.engines.hf import BASE, HFEngine, _Seq
from orchestrator.models import LoadedModel, load_model
from test_hf_engine import randomize
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
CONFIGS = {
    "llama": lambda vocab: LlamaConfig(vocab_size=vocab, **SHAPE),
    "qwen2": lambda vocab: Qwen2Config(vocab_size=vocab, **SHAPE),  # q/k/v have biases
    "mistral": lambda vocab: MistralConfig(vocab_size=vocab, sliding_window=None, **SHAPE),
}


def tiny(family: str, dtype: torch.dtype) -> LoadedModel:
    tokenizer = load_model("tiny").tokenizer
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[family](len(tokenizer)), attn_implementation="sdpa")
    if family == "qwen2":  # random biases: zeros would hide a bias left out
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    return LoadedModel(model=model.to(dtype).eval(), tokenizer=tokenizer, name=family, dtype=dtype)


def running_batch(engine: HFEngine, adapters: list[str | None]) -> list[_Seq]:
    """Prefill prompts of different lengths (left padding), one per adapter, and decode two steps."""
    loop = asyncio.new_event_loop()
    seqs = [_Seq(GenerationRequest(tuple(range(5, 12 + 3 * i)), SamplingParams(max_tokens=100, seed=i), adapter),
                 loop.create_future(), loop, torch.Generator().manual_seed(i)) for i, adapter in enumerate(adapters)]
    engine._prefill(seqs[:3])
    engine._decode()
    engine._prefill(seqs[3:])  # newcomers join a batch that has decoded already
    engine._decode()
    return seqs


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@torch.inference_mode()
def test_fused_step_gives_the_logits_of_transformers_forward(family, dtype):
    engine = HFEngine(tiny(family, dtype))
    for seed, name in enumerate(("alpha", "beta")):
        engine.add_adapter(name)
        randomize(engine, name, seed)
    seqs = running_batch(engine, ["alpha", None, "beta", "alpha", None])
    assert engine._fused is not None
    adapters = [s.adapter_key for s in engine._active]
    assert set(adapters) == {"alpha", "beta", BASE}
    ids = torch.tensor([s.tokens[-1] for s in engine._active])
    positions = engine._kv.positions()
    mask = torch.nn.functional.pad(engine._kv.mask, (0, 1), value=1)
    # both write the next column of the cache: transformers' first, so ours must rewrite it identically
    ref = engine._forward(ids[:, None], mask, engine._kv.cache(), adapters, positions).logits[:, -1]
    ref_keys = engine._kv.keys[0][: len(seqs), :, engine._kv.end].clone()
    ours = engine._fused(ids, engine._kv, positions)
    torch.testing.assert_close(engine._kv.keys[0][: len(seqs), :, engine._kv.end], ref_keys, atol=1e-5, rtol=1e-3)
    if dtype == torch.bfloat16 and family != "qwen2":
        assert torch.equal(ours, ref)  # the same ops in the same order; only a fused bias add may round apart
    else:
        torch.testing.assert_close(ours.float(), ref.float(), atol=1e-4 if dtype == torch.float32 else 0.05, rtol=1e-3)


@torch.inference_mode()
def test_grouped_lora_deltas_handle_adapters_that_skip_modules_or_differ_in_rank():
    engine = HFEngine(tiny("llama", torch.bfloat16))
    g = torch.Generator().manual_seed(3)
    for name, rank, targets in (("qv", 4, ("q_proj", "v_proj")), ("mlp", 8, ("up_proj", "down_proj"))):
        state = {}
        for module, m in engine.lora.linears.items():
            if module.endswith(targets):  # PEFT's default for Llama is q_proj and v_proj only
                state[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, m.in_features, generator=g) * 0.5
                state[f"base_model.model.{module}.lora_B.weight"] = torch.randn(m.out_features, rank, generator=g) * 0.5
        engine.add_adapter(name)
        engine.update_adapter(name, state)
    running_batch(engine, ["qv", "mlp", None, "qv"])
    adapters = [s.adapter_key for s in engine._active]
    ids = torch.tensor([s.tokens[-1] for s in engine._active])
    positions = engine._kv.positions()
    mask = torch.nn.functional.pad(engine._kv.mask, (0, 1), value=1)
    ref = engine._forward(ids[:, None], mask, engine._kv.cache(), adapters, positions).logits[:, -1]
    assert torch.equal(engine._fused(ids, engine._kv, positions), ref)


def test_engines_on_either_path_sample_the_same_tokens():
    outs = {}
    for fused in (True, False):
        engine = HFEngine(load_model("tiny", dtype="bfloat16", seed=0), fused_decode=fused)
        engine.add_adapter("alpha")
        randomize(engine, "alpha", 1)
        reqs = [GenerationRequest(tuple(range(5, 10 + i)), SamplingParams(temperature=1.0, max_tokens=16, seed=i),
                                  "alpha" if i % 2 else None) for i in range(6)]

        async def run(engine=engine, reqs=reqs):
            try:
                return await asyncio.gather(*(engine.generate(r) for r in reqs))
            finally:
                await engine.aclose()

        outs[fused] = [(o.token_ids, o.logprobs) for o in asyncio.run(run())]
    assert outs[True] == outs[False]


def test_other_shapes_step_through_transformers():
    sliding = MistralConfig(vocab_size=64, sliding_window=16, **SHAPE)  # a window the fused step does not apply
    model = AutoModelForCausalLM.from_config(sliding)
    engine = HFEngine(LoadedModel(model=model.eval(), tokenizer=load_model("tiny").tokenizer, name="m", dtype=torch.float32))
    assert FusedDecoder.build(model, engine.lora) is None
    assert engine.decode_path == "transformers"
    assert HFEngine(load_model("tiny", seed=0)).decode_path == "fused"
