"""Choosing the next token of each sequence in a batch, and the logprob it was chosen with."""
from __future__ import annotations

import torch

from ..upload import upload

# splitmix64's constants as signed int64 (torch has no uint64 arithmetic)
_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15
_MIX1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9
_MIX2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser (int64 products wrap, as its uint64 ones do)."""
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def counter_uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) per row, a pure function of (seed, counter): the counter-th output of
    a splitmix64 stream whose start is the mixed seed, top 24 bits (a float32's mantissa).

    A request draws its i-th token's uniform from (its seed, i): what it samples does not depend
    on what shares its batch, the numbers need no generator state on the host, and the same
    int64 arithmetic gives the same numbers on the CPU and on a GPU. ``seeds`` and ``counters``
    are int64 tensors of one shape, on any device.
    """
    z = _mix(_mix(seeds * _GOLDEN) + (counters + 1) * _GOLDEN)
    return _shr(z, 40).to(torch.float32) / float(1 << 24)


def sample_rows(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], uniforms: torch.Tensor,
    bitmask: torch.Tensor | None = None, masked_rows: list[int] | None = None,
) -> tuple[list[int], list[float]]:
    """``sample_on_device``, read back to the host: (token ids, logprobs) as lists."""
    ids, logprobs = sample_on_device(logits, temperatures, top_ps, uniforms, bitmask, masked_rows)
    return ids.tolist(), logprobs.tolist()


def sample_on_device(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], uniforms: torch.Tensor,
    bitmask: torch.Tensor | None = None, masked_rows: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits`` [B, V]: ids [B] (int64) and their logprobs [B] (fp32), on
    the logits' device (nothing waits for the device).

    The recorded logprob is log softmax(logits / T) at the chosen token (raw logits for greedy
    T == 0), before any top-p truncation: exactly what a teacher-forced pass at temperature T
    gives, which importance ratios need. Row i draws with ``uniforms[i]`` (in [0, 1), on any
    device; ``counter_uniforms`` makes them per request), by inverse CDF.

    ``bitmask`` [B, ceil(V / 32)] (packed int32, xgrammar's layout) bans, in ``masked_rows``, the
    tokens whose bit is 0: their logits become -inf before everything above, so those rows sample
    from, and record logprobs of, the distribution renormalised over the allowed tokens.
    """
    # Passes over [B, V] fp32 are the cost here (12.6 MB at 64 x 49k; a fresh buffer of that
    # size page-faults too), so there is one copy and the rest works on it in place:
    # 21 ms -> 6 ms per step at batch 64 (bf16 logits, 2 cores).
    device = logits.device
    x = logits.to(torch.float32, copy=True)
    masked = upload(masked_rows, device) if bitmask is not None and masked_rows else None
    if masked is not None:
        from xgrammar import apply_token_bitmask_inplace  # one op for the whole batch

        # the rows as a tensor queued behind the step: from a list xgrammar copies them pageable
        apply_token_bitmask_inplace(x, upload(bitmask, device), indices=masked.int())
    scale = upload([t if t > 0 else 1.0 for t in temperatures], device, torch.float32)[:, None]
    if any(t > 0 and t != 1.0 for t in temperatures):  # decided on the host: no device sync
        x.div_(scale)
    argmax = x.argmax(dim=-1) if any(t <= 0 for t in temperatures) else None
    top = x.amax(dim=-1, keepdim=True)
    weights = x.sub_(top).exp_()  # x now holds unnormalised probabilities (max 1)
    total = weights.sum(dim=-1, keepdim=True)
    log_z = top + total.log()  # logsumexp, without a pass of its own
    nucleus = [i for i, (p, t) in enumerate(zip(top_ps, temperatures)) if p < 1.0 and t > 0]
    if nucleus:  # all such rows in one sort
        rows = upload(nucleus, device)
        weights[rows] = _top_p(weights[rows] / total[rows], upload([top_ps[i] for i in nucleus], device, torch.float32))
    allowed = weights[masked] if masked is not None else None  # a copy: the CDF overwrites the weights
    # Inverse-CDF sampling, one uniform per row: a batched cumsum and searchsorted cost far less
    # than a multinomial call per row over a 49k vocabulary.
    cdf = weights.cumsum_(dim=-1)
    u = upload(uniforms, device, torch.float32)
    target = (1.0 - u) * cdf[:, -1]  # in (0, total]: never lands on a zero-mass prefix
    chosen_ids = torch.searchsorted(cdf, target[:, None]).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    if allowed is not None:
        # A sequential cumsum leaves a banned token's step of the CDF exactly flat; a parallel scan
        # (a GPU's) sums in another order and may leave it open by an ulp. A banned token drawn
        # would fail the grammar, and with it every request of the batch: such a row takes its
        # most likely allowed token instead.
        picked = chosen_ids[masked]
        banned = allowed.gather(-1, picked[:, None]).squeeze(-1) <= 0
        chosen_ids[masked] = torch.where(banned, allowed.argmax(dim=-1), picked)
    if argmax is not None:
        chosen_ids = torch.where(upload([t <= 0 for t in temperatures], device), argmax, chosen_ids)
    # The chosen tokens are allowed by any mask, so their logits are the unmasked ones.
    chosen = logits.gather(-1, chosen_ids[:, None]).squeeze(-1).float() / scale.squeeze(-1) - log_z.squeeze(-1)
    return chosen_ids, chosen


def top_logprobs(
    logits: torch.Tensor, temperatures: list[float], k: int,
    bitmask: torch.Tensor | None = None, masked_rows: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``k`` most likely tokens, ids [B, k] and logprobs [B, k], most likely first, under
    the distribution ``sample_on_device`` records logprobs of (its temperature and grammar mask,
    before top-p); a banned token's logprob is -inf."""
    device = logits.device
    x = logits.to(torch.float32, copy=True)
    if bitmask is not None and masked_rows:
        from xgrammar import apply_token_bitmask_inplace

        apply_token_bitmask_inplace(x, upload(bitmask, device), indices=upload(masked_rows, device).int())
    x.div_(upload([t if t > 0 else 1.0 for t in temperatures], device, torch.float32)[:, None])
    values, ids = x.topk(min(k, x.shape[-1]), dim=-1)
    return ids, values - x.logsumexp(dim=-1, keepdim=True)


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row of ``probs`` [R, V], keep the smallest set of most likely tokens whose mass reaches
    the row's ``top_p`` [R]."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p[:, None]  # always keeps the top token
    # a scatter, not boolean indexing: that counts the kept tokens on the host, a sync on a GPU
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)
