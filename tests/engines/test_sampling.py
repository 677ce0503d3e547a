"""The engine's sampler: draws follow softmax(logits / T) (within the nucleus for top-p), and the
recorded logprob is log softmax(logits / T) of the drawn token, masks included."""
from __future__ import annotations

import torch
from orchestrator.engines.sampling import counter_uniforms, sample_rows

LOGITS = torch.tensor([[0.0, 1.0, 2.0, -1.0]])


def frequencies(top_p: float, temperature: float = 1.0, n: int = 20000) -> torch.Tensor:
    """One request's first n draws: uniforms from its seed and token counter, as the engine draws them."""
    u = counter_uniforms(torch.zeros(n, dtype=torch.long), torch.arange(n))
    ids, _ = sample_rows(LOGITS.expand(n, -1), [temperature] * n, [top_p] * n, u)
    return torch.bincount(torch.tensor(ids), minlength=4).float() / n


def test_counter_uniforms_are_uniform_and_independent_across_seeds_and_counters():
    n = 50000
    along = counter_uniforms(torch.full((n,), 7), torch.arange(n))  # one request's stream
    across = counter_uniforms(torch.arange(n), torch.zeros(n, dtype=torch.long))  # first draws of many requests
    for u in (along, across):
        assert 0 <= u.min() and u.max() < 1
        assert abs(u.mean() - 0.5) < 0.01 and abs(u.std() - 12**-0.5) < 0.01
        assert torch.histc(u, bins=10, min=0, max=1).sub(n / 10).abs().max() < 0.05 * n / 10
        assert abs(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1]) < 0.02
    # neighbouring seeds and counters do not share numbers (seed s at counter c vs seed s+1 at c-1)
    assert not torch.isin(counter_uniforms(torch.arange(1, 1000), torch.zeros(999, dtype=torch.long)),
                          counter_uniforms(torch.arange(999), torch.ones(999, dtype=torch.long))).any()
    assert torch.equal(counter_uniforms(torch.tensor([3]), torch.tensor([5])), counter_uniforms(torch.tensor([3]), torch.tensor([5])))


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
    ids, logprobs = sample_rows(logits, temps, top_ps, torch.rand(5, generator=g))
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
        ids, logprobs = sample_rows(logits, [1.0, 1.0], [1.0, 1.0], counter_uniforms(torch.tensor([seed] * 2), torch.tensor([0, 1])),
                                    bitmask, masked_rows=[0])
        assert ids[0] in (1, 3) and abs(logprobs[0] - torch.log(torch.tensor(0.5)).item()) < 1e-6
        assert abs(logprobs[1] - torch.log(torch.tensor(1 / 64)).item()) < 1e-6  # row 1 is free


def test_a_banned_token_the_search_lands_on_is_never_drawn(monkeypatch):
    """A GPU's parallel cumsum may leave a banned token's flat step of the CDF open by an ulp, and
    the search land there: a masked row then takes its most likely allowed token (a free row keeps
    what the search found). Here the search is made to land on banned token 2 in both rows."""
    logits = torch.tensor([[0.0, 1.0, 5.0, 3.0]] * 2)
    bitmask = torch.tensor([[0b1011], [0b1011]], dtype=torch.int32)  # tokens 0, 1 and 3; 2 is banned
    monkeypatch.setattr(torch, "searchsorted", lambda cdf, target: torch.full(target.shape, 2))
    ids, logprobs = sample_rows(logits, [1.0, 1.0], [1.0, 1.0], torch.rand(2), bitmask, masked_rows=[0])
    assert ids == [3, 2]
    assert abs(logprobs[0] - torch.log_softmax(torch.tensor([0.0, 1.0, 3.0]), -1)[2].item()) < 1e-6


def test_the_callers_logits_are_left_alone():
    logits = torch.randn(3, 50)
    before = logits.clone()
    sample_rows(logits, [0.5, 1.0, 1.0], [1.0, 0.8, 1.0], torch.rand(3),
                torch.zeros(3, 2, dtype=torch.int32) - 1, masked_rows=[1])
    assert torch.equal(logits, before)


def test_a_uniform_of_zero_never_draws_a_token_of_no_mass():
    """counter_uniforms can give 0: the draw still takes a token with mass, never a zero-mass one at
    the start of the CDF (outside the nucleus, or banned by the grammar)."""
    bitmask = torch.tensor([[0b1110], [-1]], dtype=torch.int32)  # row 0 bans token 0
    ids, _ = sample_rows(LOGITS.expand(2, -1), [1.0, 1.0], [1.0, 0.7], torch.zeros(2), bitmask, masked_rows=[0])
    assert ids[0] in (1, 2, 3) and ids[1] in (1, 2)  # row 1's 0.7 nucleus is {2, 1}: token 0 is outside it


def test_top_p_stops_at_the_token_whose_mass_reaches_it():
    """The nucleus is the smallest set that reaches top_p: where the top token's mass is exactly
    top_p, that token alone (not it and the next one)."""
    u = counter_uniforms(torch.zeros(2000, dtype=torch.long), torch.arange(2000))
    ids, _ = sample_rows(torch.zeros(2000, 2), [1.0] * 2000, [0.5] * 2000, u)  # each token 0.5
    assert len(set(ids)) == 1
