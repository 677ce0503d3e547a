"""Per-token logprobs without a full float32 logits tensor, and the RL losses on top of them.

Notation, per action token t (mask m_t = 1) of a sequence:
    logp_t      log pi_theta(a_t | s_t) at the sampling temperature, computed here; where the
                action was sampled under a grammar mask, over the allowed tokens only (the
                masked policy is the one that sampled: docs/constrained.md)
    q_t         the sampler's logprob of the same token (Datum "logprobs")
    A_t         the advantage (Datum "advantages")
    r_t         exp(logp_t - q_t), the importance ratio

    cross_entropy        l_t = -logp_t
    importance_sampling  l_t = -r_t * A_t
    ppo                  l_t = -min(r_t * A_t, clip(r_t, lo, hi) * A_t)      (lo, hi: ratio thresholds)
    KL to the base (k3)  l_t += beta * (exp(b_t - logp_t) - (b_t - logp_t) - 1), b_t the base logprob
    entropy bonus        l_t -= eta * H_t, H_t the entropy of pi_theta(. | s_t) at the sampling
                         temperature, over the allowed tokens where a grammar masked the step (so
                         a constrained choice, say among three moves, is pushed towards uniform
                         over those moves, not over the vocabulary)

Aggregation over the batch: ``token-sum`` (Tinker's), ``token-mean`` (over all action tokens) or
``sequence-mean`` (mean over sequences of each sequence's token mean).

Each loss's options (``loss_fn_config``, a recipe's ``loss_config``) are its ``LOSS_CONFIGS``
model in ``config.py``, kept free of torch so that ``rolecast validate`` checks them cheaply.
"""
from __future__ import annotations

from typing import Callable, get_args

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..config import Aggregation, LossConfig, PPOConfig
from ..grammar.book import allowed_tokens

AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)


def token_logprobs(
    hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, temperature: float = 1.0, chunk: int = 512,
    bitmask: torch.Tensor | None = None, entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(lm_head(hidden) / T)[target] for flat ``hidden`` [N, H] and ``targets`` [N];
    with ``entropy``, also each row's entropy: (logprobs, entropies).

    ``bitmask`` [N, ceil(V / 32)] (packed int32; all ones = free) restricts each row's softmax
    to its allowed tokens. Only a [chunk, vocab] float32 block of logits exists at a time,
    forward and backward, instead of [N, vocab]: a frozen linear head (the base model's, which
    LoRA leaves alone) goes through ``_FrozenHead``, any other head through checkpointed chunks.
    """
    if torch.is_grad_enabled() and hidden.requires_grad:
        if isinstance(lm_head, torch.nn.Linear) and not any(p.requires_grad for p in lm_head.parameters()):
            logp, ent = _FrozenHead.apply(hidden, lm_head.weight, lm_head.bias, targets, temperature, chunk, bitmask,
                                          entropy)
            return (logp, ent) if entropy else logp
        run = lambda *args: checkpoint(_chunk_logprobs, *args, use_reentrant=False)  # noqa: E731
    else:
        run = _chunk_logprobs
    pieces = [run(hidden[s : s + chunk], targets[s : s + chunk], lm_head, temperature,
                  None if bitmask is None else bitmask[s : s + chunk], entropy)
              for s in range(0, hidden.shape[0], chunk)]
    if not pieces:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return (empty, empty) if entropy else empty
    if entropy:
        return torch.cat([lp for lp, _ in pieces]), torch.cat([ent for _, ent in pieces])
    return torch.cat(pieces)


def _masked_logits(
    h: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor], temperature: float, bitmask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 logits / T with banned tokens at -inf (out of place: they get no gradient), and
    the allowed tokens (None: all)."""
    logits = lm_head(h).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    allowed = None
    if bitmask is not None:
        allowed = allowed_tokens(bitmask, logits.shape[-1])
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits, allowed


def _chunk_logprobs(
    h: torch.Tensor, y: torch.Tensor, lm_head: torch.nn.Module, temperature: float,
    bitmask: torch.Tensor | None = None, entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    logits, allowed = _masked_logits(h, lm_head, temperature, bitmask)
    log_z = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, y[:, None]).squeeze(-1) - log_z
    if not entropy:
        return picked
    log_p = logits - log_z[:, None]
    if allowed is not None:  # banned tokens have p = 0 and contribute 0, not 0 * -inf
        log_p = log_p.masked_fill(~allowed, 0.0)
    return picked, -(log_p.exp() * log_p).sum(-1)


class _FrozenHead(torch.autograd.Function):
    """Logprobs (and entropies) through a frozen linear head, their gradients taken in the forward.

    With z = W h / T, d logp_y / dz = onehot(y) - p and d H / dz = -p (log p + H), so each
    position's gradient with respect to h is one [H] vector per output, g = (d/dz) W / T, known
    before the loss is: the forward computes it from the block of logits it already holds, and
    the backward only scales it by the incoming per-token gradients. Checkpointed chunks run the
    head's matmul three times (forward, forward again, backward); this runs it twice, and
    stores [N, H] per output instead of nothing. Banned tokens have p = 0: no gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, bitmask, entropy):
        head = lambda h: F.linear(h, weight, bias)  # noqa: E731
        scale = 1.0 / temperature if temperature > 0 else 1.0
        logps, ents, grads, ent_grads = [], [], [], []
        for s in range(0, hidden.shape[0], chunk):
            y = targets[s : s + chunk]
            x, allowed = _masked_logits(hidden[s : s + chunk], head, temperature,
                                        None if bitmask is None else bitmask[s : s + chunk])
            x.sub_(x.amax(-1, keepdim=True))  # less each row's max: exp cannot overflow; one exp pass in all
            picked = x.gather(-1, y[:, None])
            p = x.exp() if entropy else x.exp_()  # unnormalised; without entropy, the block itself
            total = p.sum(-1, keepdim=True)
            log_total = total.log()
            logps.append((picked - log_total).squeeze(-1))
            if entropy:
                p.div_(total)
                log_p = x.sub_(log_total)
                if allowed is not None:
                    log_p.masked_fill_(~allowed, 0.0)
                ent = -(p * log_p).sum(-1)
                ents.append(ent)
                ent_grads.append(log_p.add_(ent[:, None]).mul_(p).neg_().to(weight.dtype) @ weight * scale)
                d_logp = p.neg_()
            else:
                d_logp = p.mul_(total.reciprocal().neg_())
            d_logp.scatter_add_(-1, y[:, None], torch.ones_like(total))  # onehot(y) - p
            grads.append(d_logp.to(weight.dtype) @ weight * scale)

        def cat(pieces: list[torch.Tensor], *shape: int) -> torch.Tensor:
            return torch.cat(pieces) if pieces else hidden.new_zeros(0, *shape, dtype=torch.float32)

        ctx.save_for_backward(cat(grads, hidden.shape[1]), cat(ent_grads, hidden.shape[1]))
        ctx.entropy, ctx.dtype = entropy, hidden.dtype
        return cat(logps), cat(ents)

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        g_logp, g_ent = ctx.saved_tensors
        grad = grad_logp[:, None] * g_logp
        if ctx.entropy:
            grad = grad + grad_ent[:, None] * g_ent
        return grad.to(ctx.dtype), None, None, None, None, None, None, None


def _cross_entropy(logp, inputs, config: LossConfig):
    return -logp, {}


def _ratio(logp, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """r_t, and per token (r_t - 1) - log r_t: the estimate of KL(sampler || current) PPO
    implementations report as ``approx_kl`` (0 on-policy, grows as passes reuse the data)."""
    log_ratio = logp - inputs["logprobs"]
    ratio = torch.exp(log_ratio)
    return ratio, {"ratio": ratio, "approx_kl": (ratio - 1) - log_ratio}


def _importance_sampling(logp, inputs, config: LossConfig):
    ratio, extra = _ratio(logp, inputs)
    return -ratio * inputs["advantages"], extra


def _ppo(logp, inputs, config: PPOConfig):
    lo, hi = config.clip_low_threshold, config.clip_high_threshold
    ratio, extra = _ratio(logp, inputs)
    adv = inputs["advantages"]
    unclipped, clipped = ratio * adv, ratio.clamp(lo, hi) * adv
    # clip_fraction: the tokens whose clipped term is the smaller one (their gradient is cut)
    return -torch.minimum(unclipped, clipped), {**extra, "clip_fraction": (clipped < unclipped).float()}


LOSS_FNS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "cross_entropy": (_cross_entropy, ()),
    "importance_sampling": (_importance_sampling, ("logprobs", "advantages")),
    "ppo": (_ppo, ("logprobs", "advantages")),
}


def k3_kl(logp: torch.Tensor, base_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_base): unbiased, always >= 0."""
    d = base_logp - logp
    return torch.exp(d) - d - 1


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, lengths: list[int], how: str,
    total_tokens: float | None = None, total_sequences: int | None = None,
) -> torch.Tensor:
    """Reduce masked per-token values of a flat batch (sequences of ``lengths``) to a scalar.

    For a micro-batch of a larger batch, pass the whole batch's action-token and sequence
    counts: the micro-batch losses then add up to the full batch's loss.
    """
    weighted = per_token * mask
    if how == "token-sum":
        return weighted.sum()
    # a mean's divisor is the weights' sum, under 1 too (weights of 0.25 halved a clamp-at-1 mean);
    # where it is 0 the weighted sum is 0 too, and the mean 0 rather than 0 / 0
    if how == "token-mean":
        if total_tokens is not None:  # a number, not a new tensor: that would be a copy to the device
            return weighted.sum() / (total_tokens or 1.0)
        return weighted.sum() / _nonzero(mask.sum())
    if how == "sequence-mean":
        means = [w.sum() / _nonzero(m.sum()) for w, m in zip(weighted.split(lengths), mask.split(lengths))]
        return torch.stack(means).sum() / (total_sequences or len(lengths))
    raise ValueError(f"unknown aggregation {how!r}: use one of {', '.join(AGGREGATIONS)}")


def _nonzero(total: torch.Tensor) -> torch.Tensor:
    return total.where(total > 0, 1.0)
