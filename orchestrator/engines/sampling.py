"""Choosing the next token of each sequence in a batch, and the logprob it was chosen with."""
from __future__ import annotations

import torch


def sample_rows(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], generators: list[torch.Generator]
) -> tuple[list[int], list[float]]:
    """One token per row of ``logits`` [B, V].

    The recorded logprob is log softmax(logits / T) at the chosen token (raw logits for greedy
    T == 0), before any top-p truncation: exactly what a teacher-forced pass at temperature T
    gives, which importance ratios need. Each row draws from its own generator, so a request's
    sample does not depend on what else shares the batch.
    """
    logits = logits.float()
    scale = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32)[:, None]
    logp = torch.log_softmax(logits / scale, dim=-1)
    tokens: list[int] = []
    for i, (t, top_p, gen) in enumerate(zip(temperatures, top_ps, generators)):
        if t <= 0:
            tokens.append(int(torch.argmax(logp[i])))
            continue
        probs = logp[i].exp()
        if top_p < 1.0:
            probs = _top_p(probs, top_p)
        tokens.append(int(torch.multinomial(probs, 1, generator=gen)))
    chosen = logp[torch.arange(len(tokens)), torch.tensor(tokens)]
    return tokens, chosen.tolist()


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``."""
    sorted_p, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p  # always keeps the top token
    out = torch.zeros_like(probs)
    out[order[keep]] = sorted_p[keep]
    return out
