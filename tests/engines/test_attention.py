"""The engine's decode-step attention equals transformers' SDPA path, and the engine uses it."""
from __future__ import annotations

import pytest
import torch
from orchestrator.engines.attention import NAME, decode_attention, use_decode_attention
from support import tiny_engine
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward


class _Module(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.mark.parametrize("padded", [True, False])
@torch.inference_mode()
def test_decode_attention_equals_sdpa_with_grouped_heads_and_a_strided_cache(padded):
    g = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, dim, length = 5, 6, 2, 8, 11
    query = torch.randn(rows, heads, 1, dim, generator=g)
    buffer = torch.randn(rows + 2, kv_heads, length + 7, dim, generator=g)  # the engine's buffers are bigger
    key, value = buffer[:rows, :, 3:3 + length], (buffer[:rows, :, 3:3 + length] * 0.5 + 1)
    mask = None
    if padded:  # left padding of different widths, as the engine's batches have
        mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
        for r in range(rows):
            mask[r, ..., : 2 * r] = False
    module = _Module(heads // kv_heads)
    ours, _ = decode_attention(module, query, key, value, mask, scaling=0.3)
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert ours.shape == ref.shape == (rows, 1, heads, dim)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("queries, grad, mask_kind, to_sdpa", [
    (3, False, None, True),        # a prefill or a prefix: several queries a row
    (1, True, None, True),         # a training pass: SDPA's backward
    (1, False, "float", True),     # a float mask (not the engine's boolean padding)
    (1, False, "per-head", True),  # a boolean mask per head, not one row of padding
    (1, False, None, False),       # a decode step: the two matmuls
])
def test_only_decode_steps_leave_sdpa(monkeypatch, queries, grad, mask_kind, to_sdpa):
    import transformers.integrations.sdpa_attention as sdpa

    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", spy)
    g = torch.Generator().manual_seed(1)
    query = torch.randn(2, 4, queries, 8, generator=g)
    key, value = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    mask = {None: None, "float": torch.zeros(2, 1, queries, 5),
            "per-head": torch.rand(2, 4, queries, 5, generator=g) > 0.3}[mask_kind]
    with torch.set_grad_enabled(grad):
        ours, _ = decode_attention(_Module(2), query.requires_grad_(grad), key, value, mask)
    assert len(calls) == int(to_sdpa)
    ref, _ = sdpa_attention_forward(_Module(2), query, key, value, mask)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert ours.requires_grad == grad


def test_the_engine_switches_its_model_to_decode_attention():
    engine = tiny_engine()
    assert engine.model.config._attn_implementation == NAME


def test_a_model_on_another_attention_keeps_it():
    """Only an SDPA model switches: the decode attention hands all but decode steps to SDPA, which
    would replace an eager (or flash-attention) model's own kernels for its prefills."""
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    assert not use_decode_attention(model) and model.config._attn_implementation == "eager"
