"""The engine's decode-step attention equals transformers' SDPA path, and the engine uses it."""
from __future__ import annotations

import pytest
import torch
from orchestrator.engines.attention import NAME, decode_attention
from support import tiny_engine
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


def test_longer_queries_and_gradients_go_to_sdpa():
    g = torch.Generator().manual_seed(1)
    query = torch.randn(2, 4, 3, 8, generator=g, requires_grad=True)
    key, value = torch.randn(2, 2, 3, 8, generator=g), torch.randn(2, 2, 3, 8, generator=g)
    ours, _ = decode_attention(_Module(2), query, key, value, None)
    ref, _ = sdpa_attention_forward(_Module(2), query, key, value, None)
    torch.testing.assert_close(ours, ref)
    assert ours.requires_grad


def test_the_engine_switches_its_model_to_decode_attention():
    engine = tiny_engine()
    assert engine.model.config._attn_implementation == NAME
