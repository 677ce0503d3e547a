"""Attention for the engine's decode steps: one query token per row, written as two matmuls.

In a decode step each row attends with a single query to its whole KV cache. transformers'
SDPA path hands that to ``scaled_dot_product_attention`` (with grouped-query heads packed as a
3-token query), whose CPU kernel is built for long queries: measured on SmolLM2's shapes (64
rows, 9 heads over 3 KV heads, 130 keys, bf16, 2 cores) it took 0.93 ms per layer against
0.34 ms for ``softmax(q k^T) v`` as two batched matmuls, and attention was about a quarter of a
decode step. Everything else (prefill, training, a mask that is not boolean) goes to SDPA.

``attend`` is the computation; the engine's fused decode step (``decoder.py``) calls it
directly. For models that step through transformers' own forward, it is registered with
transformers' attention interface as ``rolecast-decode`` (``use_decode_attention``), with SDPA's
masks (boolean, True = attend).
"""
from __future__ import annotations

from typing import Any

import torch

NAME = "rolecast-decode"


def banned_columns(allowed: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``allowed`` [rows, length] (True = attend) as the [rows * kv_heads, 1, length] mask ``attend`` takes."""
    rows, length = allowed.shape
    return (~allowed).reshape(rows, 1, 1, length).expand(rows, kv_heads, 1, length).reshape(rows * kv_heads, 1, length)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, banned: torch.Tensor | None,
           scaling: float) -> torch.Tensor:
    """One query per row: ``query`` [rows, heads, dim] over ``key``/``value`` [rows, kv_heads, length, dim].

    Returns [rows, heads, dim]. ``banned`` comes from ``banned_columns`` (None: every column).
    """
    rows, heads, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # Head h reads KV head h // groups (transformers' repeat_kv order), so group the queries
    # instead of repeating the cache. The cache is a strided window of the engine's buffers
    # (engines/kv.py): rows and heads fold into one batch dim without a copy. On the CPU, bmm
    # against the window's transpose as it lies cost 1.5 ms here; a contiguous copy first, 0.05 ms
    # + 0.18 ms. cuBLAS takes the strided window as it is, and the copy would be most of the
    # traffic of a GPU step (slots.py's window is every row's whole allotment of columns).
    q = query.reshape(rows * kv_heads, groups, dim)
    k = key.reshape(rows * kv_heads, length, dim)
    if k.device.type == "cpu":
        k = k.contiguous()
    scores = torch.bmm(q, k.transpose(1, 2)).float()  # [rows * kv_heads, groups, length]
    scores.mul_(scaling)
    if banned is not None:
        scores.masked_fill_(banned, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.bmm(probs, value.reshape(rows * kv_heads, length, dim))  # [rows * kv_heads, groups, dim]
    return out.reshape(rows, heads, dim)


def attend_biased(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor,
                  scaling: float) -> torch.Tensor:
    """``attend`` in fewer kernels, for a GPU: ``bias`` is ``banned`` as 0 / -inf in the query's
    dtype. Scores come out of one ``baddbmm`` (scaled, masked) in the model's dtype, as
    transformers' eager attention rounds them, and the softmax is one kernel in that dtype too:
    it accumulates in fp32 (as transformers' fp32 softmax does) and rounds its result once, where
    ``softmax(dtype=float32).to(dtype)`` would add a cast on each side."""
    rows, heads, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    q = query.reshape(rows * kv_heads, heads // kv_heads, dim)
    k = key.reshape(rows * kv_heads, length, dim)
    scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scaling)
    return torch.bmm(torch.softmax(scores, dim=-1), value.reshape(rows * kv_heads, length, dim)).reshape(rows, heads, dim)


def attend_chunk(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                 scaling: float) -> torch.Tensor:
    """A prefill chunk of the static path: ``query`` [rows, width, heads, dim], each token over its
    row's ``key``/``value`` [rows, kv_heads, length, dim]. ``mask`` [rows, width, length] is
    boolean (True: banned; the scores in fp32, as ``attend``) or an additive bias in the query's
    dtype (0 / -inf, as ``attend_biased``). Returns [rows, width, heads, dim]."""
    rows, width, heads, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # queries grouped by their KV head (head h reads KV head h // groups), a row's tokens after its heads
    q = query.unflatten(2, (kv_heads, groups)).permute(0, 2, 3, 1, 4).reshape(rows * kv_heads, groups * width, dim)
    scores = torch.bmm(q, key.reshape(rows * kv_heads, length, dim).transpose(1, 2))
    if mask.dtype == torch.bool:
        scores = scores.float()
    grid = scores.mul_(scaling).view(rows, kv_heads, groups, width, length)
    if mask.dtype == torch.bool:
        grid.masked_fill_(mask[:, None, None], float("-inf"))
    else:
        grid.add_(mask[:, None, None])
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.bmm(probs, value.reshape(rows * kv_heads, length, dim))  # [rows * kv_heads, groups * width, dim]
    return out.view(rows, kv_heads, groups, width, dim).permute(0, 3, 1, 2, 4).reshape(rows, width, heads, dim)


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs: Any):
    """transformers' attention interface: ``attend`` for decode steps, SDPA for everything else."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask_ok = attention_mask is None or (attention_mask.dtype == torch.bool
                                         and attention_mask.shape[1:] == (1, 1, key.shape[2]))
    if query.shape[2] != 1 or torch.is_grad_enabled() or not mask_ok or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    rows, heads, _, dim = query.shape
    banned = None
    if attention_mask is not None:
        banned = banned_columns(attention_mask.reshape(rows, key.shape[2]), key.shape[1])
    out = attend(query[:, :, 0], key, value, banned, dim**-0.5 if scaling is None else scaling)
    return out.reshape(rows, 1, heads, dim), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` to the decode attention when it runs on SDPA; False when it cannot."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # an older transformers: SDPA throughout
        return False
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
