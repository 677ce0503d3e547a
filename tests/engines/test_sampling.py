"""The engine's sampler: draws follow softmax(logits / T) (within the nucleus for top-p), and the
recorded logprob is log softmax(logits / T) of the drawn token, masks included."""
from __future__ import annotations

import torch
from orchestrator.engines.sampling import sample_rows

LOGITS = torch.tensor([[0.0, 1.0, 2.0, -1.0]])


def frequencies(top_p: float, temperature: float = 1.0, n: int = 20000) -> torch.Tensor:
    g, counts = torch.Generator().manual_seed(0), torch.zeros(4)
    for _ in range(n):
        ids, _ = sample_rows(LOGITS, [temperature], [top_p], [g])
        counts[ids[0]] += 1
    return counts / n


def test_draws_follow_the_tempered_softmax():
    for temperature in (1.0, 0.5):
        expected = torch.softmax(LOGITS[0] / temperature, -1)
        assert (frequencies(1.0, temperature) - expected).abs().max() < 0.015  # 20k draws: sd < 0.0035


def test_top_p_draws_from_the_renormalised_nucleus():
    p = torch.softmax(LOGITS[0], -1)  # 0.087, 0.237, 0.644, 0.032: the 0.7 nucleus is {2, 1}
    expected = torch.tensor([0.0, p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2]), 0.0])
    assert (frequencies(0.7) - expected).abs().max() < 0.015


def test_logprobs_are_log_softmax_of_the_drawn_token_per_row():
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(5, 300, generator=g) * 3).to(torch.bfloat16)
    temps, top_ps = [0.7, 1.0, 0.0, 1.3, 1.0], [1.0, 0.9, 1.0, 1.0, 0.5]
    ids, logprobs = sample_rows(logits, temps, top_ps, [torch.Generator().manual_seed(i) for i in range(5)])
    scale = torch.tensor([t if t > 0 else 1.0 for t in temps])[:, None]
    ref = torch.log_softmax(logits.float() / scale, -1)
    for row, (token, lp) in enumerate(zip(ids, logprobs)):
        assert abs(lp - ref[row, token].item()) < 1e-5
    assert ids[2] == int(logits[2].float().argmax())  # T = 0: greedy


def test_masked_rows_sample_allowed_tokens_with_renormalised_logprobs():
    logits = torch.zeros(2, 64)
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    bitmask[0, 0] = 0b1010  # row 0 may take tokens 1 and 3 only
    for seed in range(20):
        ids, logprobs = sample_rows(logits, [1.0, 1.0], [1.0, 1.0], [torch.Generator().manual_seed(seed)] * 2,
                                    bitmask, masked_rows=[0])
        assert ids[0] in (1, 3) and abs(logprobs[0] - torch.log(torch.tensor(0.5)).item()) < 1e-6
        assert abs(logprobs[1] - torch.log(torch.tensor(1 / 64)).item()) < 1e-6  # row 1 is free


def test_the_callers_logits_are_left_alone():
    logits = torch.randn(3, 50)
    before = logits.clone()
    sample_rows(logits, [0.5, 1.0, 1.0], [1.0, 0.8, 1.0], [torch.Generator().manual_seed(i) for i in range(3)],
                torch.zeros(3, 2, dtype=torch.int32) - 1, masked_rows=[1])
    assert torch.equal(logits, before)
