"""The engine's fused decode step gives transformers' logits, with mixed adapters, for each family it
takes and in each weight layout a CPU can get (``decoder.weight_layout``): the layouts this machine
would not pick run here too, with other CPUs' features handed in."""
from __future__ import annotations

import asyncio

import pytest
import torch
from orchestrator.cpu import CpuFeatures, host
from orchestrator.engines import decoder
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.engines.decoder import FusedDecoder, weight_layout
from orchestrator.engines.hf import BASE, HFEngine, _Seq
from orchestrator.models import LoadedModel, load_model
from support import AVX2, AVX512, NO_ONEDNN, generate_together, randomize, requires_bf16, tiny_engine
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

def cpu_for(layout: str, dtype: torch.dtype) -> CpuFeatures:
    """CPU features under which this machine lays a ``dtype`` model's weights out as ``layout``."""
    if layout == "plain":
        return NO_ONEDNN
    if layout == "onednn-fp32":
        return AVX2
    if (got := weight_layout(dtype, host()))[0] != "onednn":  # flags short, or kernels capped (ONEDNN_MAX_CPU_ISA)
        pytest.skip(f"this machine lays {dtype} weights out as {got[0]} ({got[1]}); that fallback is tested")
    return host()


def assert_bf16_logits_equal(ours: torch.Tensor, ref: torch.Tensor, layout: str) -> None:
    """Bit for bit where both sides run the same bf16 kernels: plain weights, or oneDNN's prepacked
    ones where bf16 is native. Elsewhere oneDNN emulates bf16 and its prepacked kernel rounds apart
    from the matmul transformers calls (a last bit, in 1 logit of 10^5, on a Cascade Lake's AVX-512)."""
    if layout == "plain" or host().native_bf16:
        assert torch.equal(ours, ref)
    else:
        torch.testing.assert_close(ours.float(), ref.float(), atol=0.05, rtol=1e-3)


LAYOUTS = {torch.float32: ["onednn", "plain"], torch.bfloat16: ["onednn", "onednn-fp32", "plain"]}
CASES = [pytest.param(dtype, layout, id=f"{name}-{layout}", marks=[requires_bf16] if dtype == torch.bfloat16 else [])
         for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")) for layout in LAYOUTS[dtype]]

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
                 loop.create_future(), loop, seed=i) for i, adapter in enumerate(adapters)]
    engine._prefill(seqs[:3])
    engine._decode()
    engine._prefill(seqs[3:])  # newcomers join a batch that has decoded already
    engine._decode()
    return seqs


def fused_and_reference(family: str, dtype: torch.dtype, cpu: CpuFeatures, gpu_forms: bool = False):
    """The fused step's logits and transformers' forward's for a batch of mixed adapters (and none),
    rows of different lengths; the key each wrote for the new token checked equal on the way."""
    engine = HFEngine(tiny(family, dtype), cpu=cpu)
    for seed, name in enumerate(("alpha", "beta")):
        engine.add_adapter(name)
        randomize(engine, name, seed)
    seqs = running_batch(engine, ["alpha", None, "beta", "alpha", None])
    engine._fused.gpu = gpu_forms
    adapters = [s.adapter_key for s in engine._active]
    assert set(adapters) == {"alpha", "beta", BASE}
    ids = torch.tensor([s.tokens[-1] for s in engine._active])
    positions = engine._kv.positions()
    mask = torch.nn.functional.pad(engine._kv.mask, (0, 1), value=1)
    # both write the next column of the cache: transformers' first, so ours must rewrite it identically
    ref = engine._forward(ids[:, None], mask, engine._kv.cache(), adapters, positions).logits[:, -1]
    ref_keys = engine._kv.keys[0][: len(seqs), :, engine._kv.end].clone()
    with engine._routed(adapters):  # a route lasts one pass
        ours = engine._fused(ids, engine._kv, positions)
    torch.testing.assert_close(engine._kv.keys[0][: len(seqs), :, engine._kv.end], ref_keys, atol=1e-5, rtol=1e-3)
    return engine, ours, ref


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("dtype,layout", CASES)
@torch.inference_mode()
def test_fused_step_gives_the_logits_of_transformers_forward(family, dtype, layout):
    engine, ours, ref = fused_and_reference(family, dtype, cpu_for(layout, dtype))
    assert engine.decode_path == f"fused:{layout}"
    if dtype == torch.bfloat16 and family != "qwen2" and layout != "onednn-fp32":
        assert_bf16_logits_equal(ours, ref, layout)  # the same ops in the same order; a fused bias add may round apart
    else:  # onednn-fp32 rounds each bf16 matmul once, from fp32, where transformers' kernel may not
        torch.testing.assert_close(ours.float(), ref.float(), atol=1e-4 if dtype == torch.float32 else 0.05, rtol=1e-3)


@pytest.mark.parametrize("family", sorted(CONFIGS))
@torch.inference_mode()
def test_the_gpu_forms_give_the_logits_of_transformers_forward(family):
    """decoder._GpuForms (rotary as a matmul, residuals inside addmm, one-kernel norm and softmax),
    forced on here in fp32 with a GPU's plain weights: the same maths as transformers' forward."""
    _, ours, ref = fused_and_reference(family, torch.float32, NO_ONEDNN, gpu_forms=True)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-3)


@requires_bf16
@pytest.mark.parametrize("layout", ["onednn", "plain"])  # the layouts whose bf16 logits can be transformers' bit for bit
@torch.inference_mode()
def test_grouped_lora_deltas_handle_adapters_that_skip_modules_or_differ_in_rank(layout):
    engine = HFEngine(tiny("llama", torch.bfloat16), cpu=cpu_for(layout, torch.bfloat16))
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
    with engine._routed(adapters):
        assert_bf16_logits_equal(engine._fused(ids, engine._kv, positions), ref, layout)


@requires_bf16
@pytest.mark.parametrize("layout", ["onednn", "plain"])
def test_engines_on_either_path_sample_the_same_tokens(layout):
    outs = {}
    cpu = cpu_for(layout, torch.bfloat16)
    for fused in (True, False):
        engine = tiny_engine("bfloat16", fused_decode=fused, cpu=cpu)
        engine.add_adapter("alpha")
        randomize(engine, "alpha", 1)
        reqs = [GenerationRequest(tuple(range(5, 10 + i)), SamplingParams(temperature=1.0, max_tokens=16, seed=i),
                                  "alpha" if i % 2 else None) for i in range(6)]
        try:  # both engines see the same batches: bit for bit holds for a batch, not across batchings
            outs[fused] = [(o.token_ids, o.logprobs) for o in generate_together(engine, reqs)]
        finally:
            asyncio.run(engine.aclose())
    assert outs[True] == outs[False]


def test_other_shapes_step_through_transformers():
    sliding = MistralConfig(vocab_size=64, sliding_window=16, **SHAPE)  # a window the fused step does not apply
    model = AutoModelForCausalLM.from_config(sliding)
    engine = HFEngine(LoadedModel(model=model.eval(), tokenizer=load_model("tiny").tokenizer, name="m", dtype=torch.float32))
    assert FusedDecoder.build(model, engine.lora) is None
    assert engine.decode_path == "transformers"
    assert tiny_engine().decode_path == "fused:onednn"


def test_a_static_engine_refused_for_the_models_shape_leaves_the_model_free():
    """The refusal came after the adapter hooks went on: every later engine on the model was refused
    as a second open engine."""
    model = AutoModelForCausalLM.from_config(MistralConfig(vocab_size=64, sliding_window=16, **SHAPE))
    loaded = LoadedModel(model=model.eval(), tokenizer=load_model("tiny").tokenizer, name="m", dtype=torch.float32)
    with pytest.raises(ValueError, match="static decode path needs a Llama-shaped model"):
        HFEngine(loaded, static=True)
    assert HFEngine(loaded).decode_path == "transformers"


@pytest.mark.parametrize("cpu,dtype,expected", [
    (AVX512, torch.bfloat16, "onednn"),
    (AVX2, torch.bfloat16, "onednn-fp32"),
    (AVX2, torch.float32, "onednn"),
    (NO_ONEDNN, torch.bfloat16, "plain"),
    (NO_ONEDNN, torch.float32, "plain"),
    (AVX512, torch.float16, "plain"),
])
def test_weight_layout_follows_the_cpu(monkeypatch, cpu, dtype, expected):
    monkeypatch.setattr(decoder, "_prepack_runs", lambda dtype: True)  # the rule alone, whatever this CPU is
    assert weight_layout(dtype, cpu)[0] == expected


def test_a_prepack_that_fails_its_probe_falls_back(monkeypatch):
    """Flags that promise kernels the CPU lacks (a VM hiding them, say) give the next layout down."""
    monkeypatch.setattr(decoder, "_prepack_runs", lambda dtype: dtype != torch.bfloat16)
    layout, why = weight_layout(torch.bfloat16, AVX512)
    assert layout == "onednn-fp32" and "probe" in why  # fp32 prepacked, not bf16 matmuls emulated (5x slower)
    monkeypatch.setattr(decoder, "_prepack_runs", lambda dtype: False)
    assert weight_layout(torch.bfloat16, AVX512)[0] == "plain"
    monkeypatch.setattr(decoder, "_prepack_runs", lambda dtype: False)
    assert weight_layout(torch.bfloat16, AVX2)[0] == "plain"
    assert weight_layout(torch.float32, AVX2)[0] == "plain"



def test_setting_the_cpu_relays_the_weights_out():
    engine = tiny_engine()
    assert engine.decode_path == "fused:onednn"
    engine.cpu = NO_ONEDNN
    assert engine.decode_path == "fused:plain"
    engine.cpu = None
    assert engine.decode_path == "fused:onednn"
