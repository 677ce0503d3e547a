"""Losses against hand-computed values, and the training client's isolation between adapters."""
from __future__ import annotations

import asyncio
import errno
import math
import random
import re
import subprocess
from pathlib import Path

import pytest
import torch

from orchestrator.config import LossConfig, PPOConfig
from orchestrator.errors import RolecastError
from orchestrator.training import AdamParams, Datum, LoraConfig, ModelInput, ServiceClient
from orchestrator.training.losses import LOSS_FNS, aggregate, k3_kl, token_logprobs


def test_cross_entropy_and_importance_sampling_by_hand():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    inputs = {"logprobs": torch.tensor([-1.0, -1.0, -1.0]), "advantages": torch.tensor([2.0, -1.0, 0.5])}
    ce, _ = LOSS_FNS["cross_entropy"][0](logp, inputs, LossConfig())
    assert ce.tolist() == [1.0, 2.0, 0.5]
    is_, extra = LOSS_FNS["importance_sampling"][0](logp, inputs, LossConfig())
    ratios = [1.0, math.exp(-1.0), math.exp(0.5)]
    assert is_.tolist() == pytest.approx([-2.0 * ratios[0], 1.0 * ratios[1], -0.5 * ratios[2]])
    assert extra["ratio"].tolist() == pytest.approx(ratios)


def test_ppo_clips_by_hand():
    # ratios 1.5 (A>0: clipped to 1.2), 0.5 (A>0: unclipped is smaller), 0.5 (A<0: clipped to 0.8)
    logp = torch.log(torch.tensor([1.5, 0.5, 0.5]))
    inputs = {"logprobs": torch.zeros(3), "advantages": torch.tensor([1.0, 1.0, -1.0])}
    loss, extra = LOSS_FNS["ppo"][0](logp, inputs, PPOConfig(clip_low_threshold=0.8, clip_high_threshold=1.2))
    assert loss.tolist() == pytest.approx([-1.2, -0.5, 0.8])
    assert extra["clip_fraction"].tolist() == [1.0, 0.0, 1.0]
    # approx_kl = (r - 1) - log r per token
    assert extra["approx_kl"].tolist() == pytest.approx([0.5 - math.log(1.5), -0.5 - math.log(0.5), -0.5 - math.log(0.5)])


def test_k3_kl_by_hand():
    logp, base = torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -2.0])
    assert k3_kl(logp, base).tolist() == pytest.approx([0.0, math.exp(-1.0) + 1.0 - 1.0])


def test_aggregations_by_hand():
    per_token = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    mask = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0])
    lengths = [3, 2]  # sequence 1: tokens 2, 3 count; sequence 2: token 4 counts
    assert aggregate(per_token, mask, lengths, "token-sum").item() == 9.0
    assert aggregate(per_token, mask, lengths, "token-mean").item() == 3.0
    assert aggregate(per_token, mask, lengths, "sequence-mean").item() == pytest.approx((2.5 + 4.0) / 2)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(per_token, mask, lengths, "mean")
    # no action tokens (every reply a prompt's): 0, not 0 / 0 = NaN in the loss and the gradient
    none = torch.zeros(5)
    for how, counts in [("token-mean", {}), ("token-mean", {"total_tokens": 0.0}), ("sequence-mean", {})]:
        assert aggregate(per_token, none, lengths, how, **counts).item() == 0.0
    # a mean weighted by the mask is the same mean whatever the weights' scale: under 1 too
    quarter = mask * 0.25
    assert aggregate(per_token, quarter, lengths, "token-mean").item() == 3.0
    assert aggregate(per_token, quarter, lengths, "token-mean", total_tokens=0.75).item() == 3.0
    assert aggregate(per_token, quarter, lengths, "sequence-mean").item() == pytest.approx((2.5 + 4.0) / 2)


def test_chunked_logprobs_equal_full_log_softmax_with_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(37, 8, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    chunked = token_logprobs(hidden, head, targets, temperature=0.7, chunk=5)
    full = torch.log_softmax(head(hidden) / 0.7, -1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(chunked, full, atol=1e-5)
    (g1,) = torch.autograd.grad(chunked.sum(), hidden)
    (g2,) = torch.autograd.grad(full.sum(), hidden)
    assert torch.allclose(g1, g2, atol=1e-5)


def test_a_grammar_mask_unpacks_bit_k_of_word_w_as_token_32w_plus_k():
    from orchestrator.grammar.book import allowed_tokens

    row = torch.tensor([[1 | -(1 << 31), 0b10]], dtype=torch.int32)  # tokens 0, 31 (the sign bit) and 33
    allowed = allowed_tokens(row, 40)  # a vocabulary that ends inside the second word
    assert allowed.shape == (1, 40) and allowed[0].nonzero().flatten().tolist() == [0, 31, 33]


def test_entropy_is_the_full_or_the_masked_softmax_entropy_with_gradients():
    from orchestrator.grammar.book import allowed_tokens

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 64, bias=False)
    hidden = torch.randn(9, 8, requires_grad=True)
    targets = torch.randint(0, 3, (9,))
    bitmask = torch.zeros(9, 2, dtype=torch.int32)
    bitmask[:5, 0] = 0b111  # rows 0-4: three allowed tokens (a constrained choice); rows 5-8: free
    bitmask[5:] = -1
    logp, ent = token_logprobs(hidden, head, targets, temperature=0.7, chunk=4, bitmask=bitmask, entropy=True)
    logits = (head(hidden) / 0.7).masked_fill(~allowed_tokens(bitmask, 64), float("-inf"))
    full = torch.log_softmax(logits, -1)
    expected = torch.stack([-(row[row > -math.inf].exp() * row[row > -math.inf]).sum() for row in full])
    assert torch.allclose(ent, expected, atol=1e-5) and torch.allclose(logp, full.gather(-1, targets[:, None]).squeeze(-1))
    assert (ent[:5] <= math.log(3) + 1e-6).all() and (ent[5:] > math.log(3)).all()
    (g1,) = torch.autograd.grad(ent.sum(), hidden)
    (g2,) = torch.autograd.grad(expected.sum(), hidden)
    assert torch.isfinite(g1).all() and torch.allclose(g1, g2, atol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_a_frozen_head_gives_the_gradients_of_the_full_softmax(masked):
    """The base model's head is frozen: its logprobs and entropies take their gradients in the
    forward (``_FrozenHead``). Against autograd through the full log-softmax, with per-token
    upstream weights on both outputs (as a loss gives them), chunks that do not divide N, a bias,
    and a grammar mask on some rows."""
    from orchestrator.grammar.book import allowed_tokens

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 64).requires_grad_(False)
    hidden = torch.randn(11, 8, requires_grad=True)
    targets = torch.randint(0, 3, (11,))
    bitmask = torch.full((11, 2), -1, dtype=torch.int32)
    if masked:
        bitmask[:6, 0], bitmask[:6, 1] = 0b111, 0
    w_logp, w_ent = torch.randn(11), torch.randn(11)
    logp, ent = token_logprobs(hidden, head, targets, temperature=0.7, chunk=4, bitmask=bitmask, entropy=True)
    assert logp.grad_fn is not None and "FrozenHead" in type(logp.grad_fn).__name__
    (g1,) = torch.autograd.grad((w_logp * logp + w_ent * ent).sum(), hidden)

    full = torch.log_softmax((head(hidden) / 0.7).masked_fill(~allowed_tokens(bitmask, 64), float("-inf")), -1)
    ref_logp = full.gather(-1, targets[:, None]).squeeze(-1)
    ref_ent = -(full.exp() * full.masked_fill(full == -math.inf, 0.0)).sum(-1)
    assert torch.allclose(logp, ref_logp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    (g2,) = torch.autograd.grad((w_logp * ref_logp + w_ent * ref_ent).sum(), hidden, retain_graph=True)
    assert torch.allclose(g1, g2, atol=1e-5)
    alone = token_logprobs(hidden, head, targets, temperature=0.7, chunk=4, bitmask=bitmask)
    (g3,) = torch.autograd.grad((w_logp * alone).sum(), hidden)
    (g4,) = torch.autograd.grad((w_logp * ref_logp).sum(), hidden)
    assert torch.allclose(g3, g4, atol=1e-5)


def test_a_frozen_head_under_bf16_autocast_matches_the_checkpointed_chunks():
    """The training client's GPU setting: fp32 masters, bf16 autocast. The frozen head's
    gradients round like autograd's through the checkpointed chunks (both take the head's matmul
    in bf16)."""
    torch.manual_seed(1)
    head = torch.nn.Linear(16, 96, bias=False)
    hidden = torch.randn(13, 16, requires_grad=True)
    targets = torch.randint(0, 96, (13,))
    weights = torch.randn(13)
    grads = []
    for trainable in (False, True):  # a trainable head keeps the checkpointed chunks
        head.requires_grad_(trainable)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp = token_logprobs(hidden, head, targets, chunk=5)
        assert ("FrozenHead" in type(logp.grad_fn).__name__) is not trainable
        grads.append(torch.autograd.grad((weights * logp).sum(), hidden)[0])
    assert torch.allclose(grads[0], grads[1], rtol=0.02, atol=0.02)
    assert head.weight.grad is None


def test_a_frozen_head_stays_finite_where_the_logits_pass_float32_exps_range():
    """Logits of 150 at temperature 0.25 are 600 in the softmax: exp of them is inf in float32
    unless each row's max is taken off first."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 64, bias=False).requires_grad_(False)
    with torch.no_grad():
        head.weight.mul_(100)
    hidden = torch.randn(5, 8, requires_grad=True)
    targets = torch.randint(0, 64, (5,))
    logp, ent = token_logprobs(hidden, head, targets, temperature=0.25, chunk=4, entropy=True)
    full = torch.log_softmax(head(hidden) / 0.25, -1)
    assert head(hidden).abs().max() > 100
    assert torch.allclose(logp, full.gather(-1, targets[:, None]).squeeze(-1), rtol=1e-5)
    assert torch.isfinite(ent).all() and torch.isfinite(torch.autograd.grad((logp + ent).sum(), hidden)[0]).all()


@pytest.mark.parametrize("frozen", [False, True])
def test_temperature_0_is_read_as_1_by_either_head(frozen):
    """A greedy role's actions (temperature 0) are scored at temperature 1, as LossConfig says:
    divided by 0, every logit was inf and every logprob and gradient NaN."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50).requires_grad_(not frozen)
    hidden = torch.randn(7, 8, requires_grad=True)
    targets = torch.randint(0, 50, (7,))
    greedy, ent0 = token_logprobs(hidden, head, targets, temperature=0.0, chunk=4, entropy=True)
    plain, ent1 = token_logprobs(hidden, head, targets, temperature=1.0, chunk=4, entropy=True)
    assert torch.allclose(greedy, plain) and torch.allclose(ent0, ent1)
    (g0,) = torch.autograd.grad((greedy + ent0).sum(), hidden)
    (g1,) = torch.autograd.grad((plain + ent1).sum(), hidden)
    assert torch.allclose(g0, g1)


@pytest.fixture(scope="module")
def service():
    svc = ServiceClient("tiny", bf16_autocast=False)
    yield svc
    svc.close()


def datum(advantage: float = 1.0, sampling: float = -5.0) -> Datum:
    toks = list(range(100, 121))
    n = len(toks) - 1
    return Datum(ModelInput.from_ints(toks[:-1]), {
        "target_tokens": toks[1:], "mask": [0.0] * 6 + [1.0] * (n - 6),
        "logprobs": [sampling] * n, "advantages": [advantage] * n,
    })


def test_gradients_reach_only_the_trained_adapter(service):
    a = service.create_lora_training_client("iso_a", LoraConfig(rank=4))
    b = service.create_lora_training_client("iso_b", LoraConfig(rank=4))
    b_before = b.adapter_state()
    a_before = a.adapter_state()
    a.forward_backward([datum()], "importance_sampling").result()
    a.optim_step(AdamParams(learning_rate=1e-2)).result()
    b_after = b.adapter_state()
    assert len(b_after) == len(b_before) > 0 and len(b.params) > 0
    assert all(torch.equal(b_before[k], v) for k, v in b_after.items())
    assert any(not torch.equal(a_before[k], v) for k, v in a.adapter_state().items())
    assert all(p.grad is None for p in b.params)


def test_optim_step_reports_the_norm_it_clipped_by(service):
    c = service.create_lora_training_client("clip", LoraConfig(rank=4))
    c.perturb(0.1, 0).result()  # B = 0 would give A no gradient
    c.forward_backward([datum()], "importance_sampling").result()
    service.close()
    norm = float(torch.cat([p.grad.flatten() for p in c.params]).norm())  # the job has run: close() waited
    step = c.optim_step(AdamParams(learning_rate=1e-2, grad_clip_norm=norm / 4)).result()
    assert norm > 0 and step.step == 1 and step.metrics["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert c.optim_step(AdamParams()).result().metrics == {"grad_norm": 0.0, "skipped_step": 0.0}  # no gradient


@pytest.mark.parametrize("clip", [0.25, 0.0], ids=["clipped", "unclipped"])
def test_an_optim_step_is_adamw_on_the_clipped_gradient_by_hand(service, clip):
    """Adam's first step moves each weight by lr * g / (|g| + eps), after decay by lr * weight_decay,
    g clipped to grad_clip_norm; its moments are (1 - beta) g and (1 - beta2) g^2. Only the norm
    was checked: the clip, weight_decay or beta2 left out of the step passed. A grad_clip_norm of 0
    is no clipping (clipped to a norm of 0, the recipe default would train nothing)."""
    c = service.create_lora_training_client(f"adamw_{int(clip * 100)}", LoraConfig(rank=4))
    c.perturb(0.1, 0).result()
    c.forward_backward([datum()], "importance_sampling").result()
    service.close()
    before, grads = [p.detach().clone() for p in c.params], [p.grad.clone() for p in c.params]
    norm = float(torch.cat([g.flatten() for g in grads]).norm())
    adam = AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-4, weight_decay=0.5, grad_clip_norm=norm * clip)
    c.optim_step(adam).result()
    for p, p0, g in zip(c.params, before, grads):
        if clip:
            g = g * (adam.grad_clip_norm / (norm + 1e-6))  # torch's clip factor
        lr = adam.learning_rate
        assert torch.allclose(p.detach(), p0 * (1 - lr * adam.weight_decay) - lr * g / (g.abs() + adam.eps), atol=1e-7)
        state = c.optimizer.state[p]
        assert torch.allclose(state["exp_avg"], (1 - adam.beta1) * g, atol=1e-9)
        assert torch.allclose(state["exp_avg_sq"], (1 - adam.beta2) * g * g, atol=1e-12)


def test_a_non_finite_gradient_skips_the_step_and_keeps_the_weights(service):
    """A NaN out of the loss (or a bf16 overflow) used to go through clipping into AdamW and make
    every weight NaN for good; the step is skipped on the device and the next one trains."""
    c = service.create_lora_training_client("nan", LoraConfig(rank=4))
    c.perturb(0.1, 0).result()
    before = c.adapter_state()
    c.forward_backward([datum(advantage=float("nan"))], "importance_sampling").result()
    step = c.optim_step(AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
    assert math.isnan(step.metrics["grad_norm"]) and step.metrics["skipped_step"] == 1.0 and step.step == 1
    assert all(torch.equal(before[k], v) for k, v in c.adapter_state().items())
    assert all(float(s["exp_avg"].abs().sum()) == 0 for s in c.optimizer.state.values())
    c.forward_backward([datum()], "importance_sampling").result()
    step = c.optim_step(AdamParams(learning_rate=1e-2)).result()
    assert step.metrics["skipped_step"] == 0.0 and math.isfinite(step.metrics["grad_norm"])
    after = c.adapter_state()
    assert all(torch.isfinite(v).all() for v in after.values()) and any(not torch.equal(before[k], v) for k, v in after.items())


@pytest.mark.parametrize("option, value, problem", [
    ("learning_rate", float("nan"), "finite"), ("learning_rate", -1e-2, "greater than 0"),
    ("grad_clip_norm", -1.0, "greater than or equal to 0"), ("beta1", 1.5, "less than 1"),
    ("weight_decay", -0.1, "greater than or equal to 0"), ("eps", 0.0, "greater than 0"),
])
def test_adam_params_out_of_range_are_one_line_errors(option, value, problem):
    """The checks of a recipe's ``adam:``: a NaN learning rate made every weight NaN, a negative
    one climbed the loss and a negative grad_clip_norm left the gradient unclipped, silently."""
    with pytest.raises(ValueError, match=f"^AdamParams.{option}: .*{problem}[^\n]*$"):
        AdamParams(**{option: value})
    assert AdamParams(learning_rate=1e-3, grad_clip_norm=0.0).learning_rate == 1e-3  # 0: no clipping


@pytest.mark.parametrize("option, value, problem", [
    ("alpha", 0.0, "greater than 0"), ("alpha", float("nan"), "finite"), ("rank", 0, "greater than or equal to 1"),
    ("dropout", 1.0, "less than 1"), ("target_modules", ("q_proj", "lm_head"), "lm_head: not a module"),
])
def test_lora_config_out_of_range_is_a_one_line_error(option, value, problem):
    """The checks of a recipe's ``lora:``: through the client API alpha 0 trained an adapter that
    changed nothing, a NaN one made NaN weights."""
    with pytest.raises(ValueError, match=f"^LoraConfig.{option}: .*{problem}[^\n]*$"):
        LoraConfig(**{option: value})
    assert LoraConfig(rank=4, target_modules=("q_proj",)).target_modules == ("q_proj",)


@pytest.mark.parametrize("option, value", [("micro_batch_tokens", 0), ("micro_batch_tokens", -5), ("pass_tokens", -1)])
def test_a_service_token_budget_out_of_range_is_one_line(option, value):
    """micro_batch_tokens 0 had meant the default, unsaid, and a negative one a pass per datum."""
    with pytest.raises(ValueError, match=f"^{option}: {value}; a number of tokens"):
        ServiceClient("tiny", **{option: value})


def test_results_are_read_when_first_asked_for_and_once():
    """On a GPU a call's results arrive after it returns (upload.Download); reading them waits."""
    from orchestrator.training.types import ForwardBackwardOutput, OptimStepResponse

    reads = []

    def later():
        reads.append(1)
        return {"loss_fn_outputs": [{"logprobs": torch.zeros(2)}], "metrics": {"loss": 0.5}}

    out = ForwardBackwardOutput(later=later)
    assert reads == []
    assert out.metrics == {"loss": 0.5} and len(out.loss_fn_outputs) == 1 and reads == [1]
    step = OptimStepResponse(3, later=lambda: {"grad_norm": 1.5})
    assert step.step == 3 and step.metrics == {"grad_norm": 1.5} and repr(step) == "OptimStepResponse(step=3, metrics={'grad_norm': 1.5})"
    assert ForwardBackwardOutput([], {"loss": 1.0}).metrics == {"loss": 1.0}


def test_a_wait_that_times_out_leaves_the_call_to_run(service):
    """``result_async(timeout)`` that timed out once cancelled the call where it was still
    queued: the optimizer step never ran and its result was a CancelledError."""
    import threading

    c = service.create_lora_training_client("waited", LoraConfig(rank=4))
    busy = threading.Event()
    service.submit(busy.wait)  # the compute thread is busy until the wait has timed out
    step = c.optim_step(AdamParams())

    async def wait_briefly():
        with pytest.raises(asyncio.TimeoutError):
            await step.result_async(timeout=0.01)

    asyncio.run(wait_briefly())
    busy.set()
    assert step.result().step == 1 and c.step == 1


def test_cross_entropy_loss_matches_returned_logprobs(service):
    c = service.create_lora_training_client("ce", LoraConfig(rank=4))
    d = datum()
    out = c.forward([d], "cross_entropy").result()
    logp = out.loss_fn_outputs[0]["logprobs"]
    mask = torch.tensor(d.loss_fn_inputs["mask"])
    assert out.metrics["loss"] == pytest.approx(float(-(logp * mask).sum()), rel=1e-5)
    assert out.metrics["tokens"] == float(mask.sum())


def test_on_policy_ratio_is_one(service):
    c = service.create_lora_training_client("onpol", LoraConfig(rank=4))
    d = datum()
    logp = c.forward([d], "cross_entropy", {"temperature": 0.8}).result().loss_fn_outputs[0]["logprobs"]
    d.loss_fn_inputs["logprobs"] = logp.tolist()
    out = c.forward_backward([d], "ppo", {"temperature": 0.8}).result()
    assert out.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert out.metrics["clip_fraction"] == 0.0 and out.metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_weights_under_one_give_the_same_means_over_their_sum(service):
    """Tinker's weights need not be 1: a call's token-mean and its per-token means are over the
    weights' sum (``tokens``), as ``aggregate`` takes them, so halving every weight changes neither."""
    c = service.create_lora_training_client("halved", LoraConfig(rank=4))
    whole, half = datum(), datum()
    half.loss_fn_inputs["mask"] = [0.5 * w for w in half.loss_fn_inputs["mask"]]
    one, halved = (c.forward([d], "ppo", {"aggregation": "token-mean"}).result().metrics for d in (whole, half))
    assert halved["tokens"] == one["tokens"] / 2
    assert halved["loss"] == pytest.approx(one["loss"]) and halved["ratio_mean"] == pytest.approx(one["ratio_mean"])


def test_a_call_with_no_action_tokens_leaves_the_per_token_means_out(service):
    """Every token an observation (forced closing tokens, say): no ratio, KL or entropy was measured,
    and a step's row leaves them out (loop._calls_summed, _mean) rather than read a ratio of 0.0."""
    c = service.create_lora_training_client("none", LoraConfig(rank=4))
    d = datum()
    d.loss_fn_inputs["mask"] = [0.0] * len(d.loss_fn_inputs["mask"])
    out = c.forward_backward([d], "ppo", {"kl_coef": 0.1, "entropy_coef": 0.1}).result()
    assert out.metrics == {"loss": 0.0, "loss:sum": 0.0, "tokens": 0.0}


def test_kl_to_base_is_zero_for_a_fresh_adapter(service):
    c = service.create_lora_training_client("kl", LoraConfig(rank=4))
    for temperature in (1.0, 0.7):  # the base's logprobs at the sampling temperature too
        out = c.forward([datum()], "importance_sampling", {"kl_coef": 0.1, "temperature": temperature}).result()
        assert out.metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # B = 0: the adapter is the base model


def test_the_kl_penalty_adds_beta_times_the_kl_it_reports(service):
    """An adapter moved off the base: the loss is the plain loss plus kl_coef x the summed k3
    terms (token-sum), and the KL is to the base model's logprobs, not the adapter's own."""
    c = service.create_lora_training_client("kl_moved", LoraConfig(rank=4))
    c.perturb(0.5, 0).result()
    plain = c.forward([datum()], "importance_sampling").result().metrics
    penalised = c.forward([datum()], "importance_sampling", {"kl_coef": 0.5}).result().metrics
    assert penalised["kl"] > 1e-3
    assert penalised["loss"] == pytest.approx(plain["loss"] + 0.5 * penalised["kl"] * plain["tokens"], rel=1e-4)


def test_the_entropy_bonus_raises_the_entropy_it_reports(service):
    c = service.create_lora_training_client("ent", LoraConfig(rank=4))
    d = datum(advantage=0.0)  # no policy gradient: the bonus alone moves the adapter
    before = c.forward([d], "importance_sampling", {"entropy_coef": 1.0}).result()
    assert before.metrics["entropy"] > 0 and before.metrics["loss"] == pytest.approx(-before.metrics["entropy"] * before.metrics["tokens"], rel=1e-4)
    for _ in range(3):
        c.forward_backward([d], "importance_sampling", {"entropy_coef": 1.0}).result()
        c.optim_step(AdamParams(learning_rate=1e-2)).result()
    after = c.forward([d], "importance_sampling", {"entropy_coef": 1.0}).result()
    assert after.metrics["entropy"] > before.metrics["entropy"]
    assert "entropy" not in c.forward([d], "importance_sampling").result().metrics  # off by default


def test_bad_calls_are_clear(service):
    c = service.create_lora_training_client("bad", LoraConfig(rank=4))
    with pytest.raises(ValueError, match="unknown loss_fn"):
        c.forward([datum()], "dpo").result()
    with pytest.raises(ValueError, match="clip_low"):  # a misspelt option is an error, not the default
        c.forward([datum()], "ppo", {"clip_low": 0.9}).result()
    with pytest.raises(ValueError, match="aggregation"):
        c.forward([datum()], "importance_sampling", {"aggregation": "mean"}).result()
    d = datum()
    del d.loss_fn_inputs["advantages"]
    with pytest.raises(ValueError, match="needs loss_fn_inputs\\['advantages'\\]"):
        c.forward_backward([d], "ppo").result()
    empty = Datum(ModelInput.from_ints([]), {"target_tokens": [], "mask": [], "logprobs": [], "advantages": []})
    for data in ([empty], [datum(), empty]):  # alone, it failed in the pass: "max() arg is an empty sequence"
        with pytest.raises(ValueError, match=f"^datum {len(data) - 1}: model_input holds no tokens"):
            c.forward_backward(data, "ppo").result()
    with pytest.raises(ValueError, match="already has a training client"):
        service.create_lora_training_client("bad")


@pytest.mark.parametrize("key", ["mask", "weights"])
def test_a_negative_or_nan_weight_is_refused(service, key):
    """Only positions weighted above 0 go through the LM head: a weight of -1 was a loss of 0 and
    no gradient (tokens: -14), a NaN one a NaN loss with no gradient to skip the step for."""
    c = service.create_lora_training_client(f"weights_{key}", LoraConfig(rank=4))
    for bad in (-1.0, float("nan")):
        d = datum()
        d.loss_fn_inputs[key] = d.loss_fn_inputs.pop("mask")
        d.loss_fn_inputs[key][-3] = d.loss_fn_inputs[key][-1] = bad  # the first is named
        with pytest.raises(ValueError, match=f"^loss_fn_inputs\\[{key!r}\\] holds {bad} at position 17: a weight is 0 .no loss. or more$"):
            c.forward_backward([datum(), d], "cross_entropy").result()
    assert all(p.grad is None for p in c.params)


def test_a_bad_datum_in_a_later_micro_batch_leaves_no_gradient(service):
    """Each datum's inputs are checked before any pass: a wrong length found in the second
    micro-batch once raised after the first had put its gradients into the adapter."""
    c = service.create_lora_training_client("bad_later", LoraConfig(rank=4))
    c.perturb(0.1, 0).result()
    short, untargeted = datum(), datum()
    for d in (short, untargeted):  # tokens of their own: no prefix shared with the first datum's micro-batch
        d.model_input = ModelInput.from_ints([t + 100 for t in d.model_input.tokens])
    short.loss_fn_inputs["advantages"] = [1.0] * 3
    del untargeted.loss_fn_inputs["target_tokens"]
    service.micro_batch_tokens = 25  # one datum per micro-batch
    try:
        with pytest.raises(ValueError, match="'advantages'.*shape \\(3,\\)"):
            c.forward_backward([datum(), short], "ppo").result()
        assert all(p.grad is None for p in c.params)
        with pytest.raises(ValueError, match="needs loss_fn_inputs\\['target_tokens'\\] \\(missing in datum 1\\)"):
            c.forward_backward([datum(), untargeted], "ppo").result()
        # token ids past the vocabulary: an IndexError out of the embedding, or the LM head's gather
        # (on a GPU a device-side assert), after the first micro-batch's backward
        vocab = service.loaded.model.get_input_embeddings().num_embeddings  # the first id past its end
        for key, where in (("model_input", -1), ("target_tokens", -1), ("target_tokens", -2)):
            bad = datum()
            bad.model_input = ModelInput.from_ints([t + 200 for t in bad.model_input.tokens])
            if key == "model_input":
                bad.model_input = ModelInput.from_ints([*bad.model_input.tokens[:where], vocab])
            else:
                bad.loss_fn_inputs["target_tokens"][where] = -1 if where == -2 else vocab
            with pytest.raises(ValueError, match=f"datum 1: {key} holds token id .*outside the model's vocabulary"):
                c.forward_backward([datum(), bad], "ppo").result()
        masked = datum()  # a target the loss never reads (mask 0) is no one's business
        masked.loss_fn_inputs["target_tokens"][0] = 10**6
        c.forward([masked], "ppo").result()
    finally:
        service.micro_batch_tokens = 4096
    assert all(p.grad is None for p in c.params)


@pytest.mark.parametrize("how", ["token-sum", "token-mean", "sequence-mean"])
def test_micro_batches_add_up_to_the_full_batch(service, how):
    c = service.create_lora_training_client(f"micro_{how}", LoraConfig(rank=4))
    torch.manual_seed(0)
    for p in c.params:  # non-zero B so gradients reach A too
        p.data.normal_(0, 0.05)
    data = [datum(advantage=a) for a in (1.0, -0.5, 2.0)]
    data[1] = Datum(ModelInput.from_ints(list(range(300, 330))), {  # a longer one, other mask
        "target_tokens": list(range(301, 331)), "mask": [0.0] * 10 + [1.0] * 20,
        "logprobs": [-4.0] * 30, "advantages": [-0.5] * 30})
    config = {"aggregation": how}
    results = []
    for budget in (10_000, 25):  # one pass, then one datum per micro-batch
        service.micro_batch_tokens = budget
        out = c.forward_backward(data, "ppo", config).result()
        results.append((out, [p.grad.clone() for p in c.params]))
        c.optimizer.zero_grad(set_to_none=True)
    service.micro_batch_tokens = 4096
    (full, g_full), (micro, g_micro) = results
    assert micro.metrics["loss"] == pytest.approx(full.metrics["loss"], rel=1e-4, abs=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(g_full, g_micro))
    assert all(torch.allclose(a["logprobs"], b["logprobs"], atol=1e-5)
               for a, b in zip(full.loss_fn_outputs, micro.loss_fn_outputs))


@pytest.mark.parametrize("how", ["token-mean", "sequence-mean"])
def test_calls_told_their_batch_add_up_to_one_call_over_it(service, how):
    """The loop splits an adapter's batch into calls (roles at other temperatures, or with loss
    options of their own); told the whole batch's counts, the calls' mean is the batch's mean, as
    the aggregation says, not a mean per call summed over the calls."""
    c = service.create_lora_training_client(f"split_{how}", LoraConfig(rank=4))
    torch.manual_seed(0)
    for p in c.params:
        p.data.normal_(0, 0.05)
    data = [datum(advantage=a) for a in (1.0, -0.5, 2.0)]
    whole = {"batch_tokens": float(sum(d.mask().sum() for d in data)), "batch_sequences": len(data)}
    grads, losses = [], []
    for parts, extra in (([data], {}), ([data[:1], data[1:]], whole)):
        outs = service.forward_backward_many([(c, part, "ppo", {"aggregation": how, **extra}) for part in parts]).result()
        losses.append(sum(o.metrics["loss"] for o in outs))
        grads.append([p.grad.clone() for p in c.params])
        c.optimizer.zero_grad(set_to_none=True)
    assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(*grads))


def test_shared_prefixes_computed_once_give_the_same_logprobs_and_gradients(service):
    """A prefix tree with every kind of sharing: all datums share an opening, two pairs branch
    later, one datum is a prefix of another, one is repeated, one shares nothing; actions start
    inside shared parts too. Computed as a tree and as plain rows, it gives the same numbers."""
    c = service.create_lora_training_client("shared", LoraConfig(rank=4))
    torch.manual_seed(1)
    for p in c.params:
        p.data.normal_(0, 0.05)
    opening, middle = list(range(200, 240)), list(range(500, 540))  # 40 tokens each: neither is folded
    seqs = [opening + middle + [600, 601, 602], opening + middle + [610, 611], opening + middle[:30],
            opening + [700, 701, 702, 703, 704, 705, 706, 707], opening + [700, 701, 702, 800],
            opening + middle + [610, 611], list(range(900, 930))]
    data = []
    for k, toks in enumerate(seqs):
        n = len(toks) - 1
        mask = [0.0] * 38 + [1.0] * (n - 38) if n > 38 else [0.0] * 10 + [1.0] * (n - 10)
        data.append(Datum(ModelInput.from_ints(toks[:-1]), {
            "target_tokens": toks[1:], "mask": mask, "logprobs": [-4.0] * n, "advantages": [1.0 - 0.4 * k] * n}))
    from orchestrator.training import prefix_tree
    tree = prefix_tree.build([d.model_input.tokens for d in data])
    assert max(s.depth for s in tree.segments) == 2  # opening -> middle -> tails: gradients cross two waves
    assert tree.tokens < sum(d.model_input.length for d in data) / 2
    results = []
    for share in (True, False):
        service.share_prefixes = share
        out = c.forward_backward(data, "ppo", {"aggregation": "token-mean", "entropy_coef": 0.01}).result()
        results.append((out, [p.grad.clone() for p in c.params]))
        c.optimizer.zero_grad(set_to_none=True)
    service.share_prefixes = True
    (shared, g_shared), (full, g_full) = results
    assert shared.metrics["loss"] == pytest.approx(full.metrics["loss"], rel=1e-5, abs=1e-7)
    assert all(torch.allclose(a["logprobs"], b["logprobs"], atol=1e-5)
               for a, b in zip(shared.loss_fn_outputs, full.loss_fn_outputs))
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(g_shared, g_full))
    assert any(g.abs().sum() > 0 for g in g_shared)



def test_a_dearer_pass_folds_shared_openings_into_fewer_passes(service, monkeypatch):
    """``pass_tokens`` (a pass's fixed cost, in tokens: thousands on a GPU) decides whether a
    GRPO group's shared prompt gets a pass of its own: at the CPU's 32 it does (two waves); at
    4,096 it is recomputed in each of the group's rows: one pass fewer, the same numbers."""
    from orchestrator.training import prefix_tree

    c = service.create_lora_training_client("dear", LoraConfig(rank=4))
    torch.manual_seed(2)
    for p in c.params:
        p.data.normal_(0, 0.05)
    prompt = list(range(300, 340))
    seqs = [prompt + [400 + 10 * k + j for j in range(12)] for k in range(4)] + [list(range(600, 800))]  # and a long one alone
    data = [Datum(ModelInput.from_ints(t[:-1]), {"target_tokens": t[1:], "mask": [0.0] * 39 + [1.0] * (len(t) - 40),
                                                "logprobs": [-4.0] * (len(t) - 1), "advantages": [0.5 - 0.3 * k] * (len(t) - 1)})
            for k, t in enumerate(seqs)]
    passes = []
    forward = prefix_tree._forward
    monkeypatch.setattr(prefix_tree, "_forward", lambda body, segs, rows, *a: passes.append(len(rows)) or forward(body, segs, rows, *a))
    results = {}
    for cost in (service.pass_tokens, 4096):
        monkeypatch.setattr(service, "pass_tokens", cost)
        passes.clear()
        results[cost] = (c.forward_backward(data, "ppo", {}).result(), [p.grad.clone() for p in c.params], list(passes))
        c.optimizer.zero_grad(set_to_none=True)
    (cheap, g_cheap, p_cheap), (dear, g_dear, p_dear) = results[32], results[4096]
    assert sorted(p_cheap) == [1, 1, 4] and sorted(p_dear) == [1, 4]  # the prompt, the long row, the tails
    assert all(torch.allclose(a["logprobs"], b["logprobs"], atol=1e-5) for a, b in zip(cheap.loss_fn_outputs, dear.loss_fn_outputs))
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(g_cheap, g_dear))

def test_perturb_moves_only_its_own_adapter_b_and_is_seeded(service):
    x = service.create_lora_training_client("noisy-x", LoraConfig(rank=4))
    y = service.create_lora_training_client("noisy-y", LoraConfig(rank=4))
    before_y = y.adapter_state()
    x.perturb(0.01, "0:noisy-x").result()
    state = x.adapter_state()
    bs = [v for k, v in state.items() if "lora_B" in k]
    assert bs and all(v.abs().max() > 0 for v in bs) and 0.005 < torch.cat([v.flatten() for v in bs]).std() < 0.02
    assert all(torch.equal(before_y[k], v) for k, v in y.adapter_state().items())  # the other member is untouched
    z = service.create_lora_training_client("noisy-z", LoraConfig(rank=4))
    z.perturb(0.01, "0:noisy-x").result()  # the same seed draws the same noise
    assert all(torch.equal(state[k], v) for k, v in z.adapter_state().items() if "lora_B" in k)


def test_lora_a_is_drawn_from_the_seed_and_the_adapter_name():
    from orchestrator.models import load_model

    def a_weights(seed, names):
        svc = ServiceClient(load_model("tiny", dtype="float32"), seed=seed, bf16_autocast=False)
        clients = {n: svc.create_lora_training_client(n, LoraConfig(rank=4)) for n in names}
        return {n: {k: v for k, v in c.adapter_state().items() if "lora_A" in k} for n, c in clients.items()}

    first, reordered, other_seed = a_weights(0, ["p", "q"]), a_weights(0, ["q", "p"]), a_weights(1, ["p"])
    key = next(iter(first["p"]))
    assert all(torch.equal(first[n][k], reordered[n][k]) for n in "pq" for k in first[n])  # creation order is irrelevant
    assert not torch.equal(first["p"][key], first["q"][key]) and not torch.equal(first["p"][key], other_seed["p"][key])
    bound = first["p"][key].shape[1] ** -0.5  # PEFT's kaiming-uniform range
    assert 0.5 * bound < first["p"][key].abs().max() <= bound


def test_a_shared_service_trains_the_engines_model_without_changing_what_the_engine_samples():
    """shared=True (what `rolecast train` does on a GPU): one copy of the base weights for the
    engine and the trainer. PEFT's layers stay off for the engine's passes, and a training step
    computes what a service with a model of its own computes."""
    import asyncio

    from orchestrator.engines.base import GenerationRequest, SamplingParams
    from support import tiny_engine

    def sample(engine):
        reqs = [GenerationRequest(tuple(range(5, 12 + i)), SamplingParams(max_tokens=6, seed=i)) for i in range(3)]
        return [o.token_ids for o in asyncio.run(_gather(engine, reqs))]

    engine = tiny_engine(static=True)
    before = sample(engine)
    shared = ServiceClient(engine.loaded, shared=True, bf16_autocast=False)
    own = ServiceClient(tiny_engine().loaded, bf16_autocast=False)
    d = datum()
    outs = []
    for svc in (shared, own):
        c = svc.create_lora_training_client("s", LoraConfig(rank=4))
        with torch.no_grad():  # the same non-zero adapter in both, so the pass really adds LoRA
            for name, p in svc.peft.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.01)
        outs.append(c.forward_backward([d], "importance_sampling").result())
    assert outs[0].metrics["loss"] == pytest.approx(outs[1].metrics["loss"], rel=1e-5)
    assert torch.allclose(outs[0].loss_fn_outputs[0]["logprobs"], outs[1].loss_fn_outputs[0]["logprobs"], atol=1e-5)
    assert sample(engine) == before  # the trainer's adapter, non-zero now, is not in the engine's passes
    later = tiny_engine(static=True)  # PEFT's layers in place before this engine builds its decode step
    svc = ServiceClient(later.loaded, shared=True, bf16_autocast=False)
    svc.create_lora_training_client("s", LoraConfig(rank=4))
    with torch.no_grad():
        for name, p in svc.peft.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    assert sample(later) == before
    assert next(engine.model.parameters()).dtype == torch.float32 and shared.loaded is engine.loaded
    with pytest.raises(ValueError, match="engine.loaded"):
        ServiceClient("tiny", shared=True)


@pytest.mark.parametrize("adapters", [["s"], ["s", None]], ids=["one-adapter", "mixed"])
def test_a_shared_service_trains_alike_after_the_engine_served_its_adapter(tmp_path, adapters):
    """On a GPU the engine's hooks sit on the modules the shared service trains: a route the
    engine left set after its last pass added the engine's deltas to the next training pass
    (one adapter: its inference tensors reached autograd and the backward failed; a mix: row
    masks of the wrong batch). It crashed `rolecast train` at its second step on the GPU."""
    import asyncio

    from orchestrator.engines.base import GenerationRequest, SamplingParams
    from support import tiny_engine

    engine = tiny_engine(static=True)
    svc = ServiceClient(engine.loaded, shared=True, bf16_autocast=False)
    svc.attach_engine(engine)
    client = svc.create_lora_training_client("s", LoraConfig(rank=4))
    client.perturb(0.5, 1).result()  # B != 0: the engine's copy of the adapter adds a delta
    client.save_weights_for_sampler(tmp_path / "s").result()
    before = client.forward([datum()], "importance_sampling").result()
    reqs = [GenerationRequest(tuple(range(5, 12 + i)), SamplingParams(max_tokens=4, seed=i), adapters[i % len(adapters)])
            for i in range(3)]
    for _ in range(2):  # each prefill routes rows to the engine's adapter (the first decode step resets the stacks)
        asyncio.run(_gather(engine, reqs))
    after = client.forward_backward([datum()], "importance_sampling").result()
    assert torch.allclose(after.loss_fn_outputs[0]["logprobs"], before.loss_fn_outputs[0]["logprobs"], atol=1e-6)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in client.lora_params("lora_B"))


def test_push_to_sampler_gives_the_engine_what_a_saved_dir_would_and_writes_nothing(tmp_path):
    """What the training loop does each step where the engine holds the adapters in this process:
    the weights reach the engine straight from the trainer, under a new version."""
    from safetensors.torch import load_file
    from support import tiny_engine

    engine = tiny_engine()
    svc = ServiceClient("tiny", bf16_autocast=False)
    svc.attach_engine(engine)
    client = svc.create_lora_training_client("s", LoraConfig(rank=4))
    assert not client.samples_in_process
    with pytest.raises(RuntimeError, match="use save_weights_for_sampler"):
        client.push_to_sampler().result()
    assert client.save_weights_for_sampler(tmp_path / "s").result() == 1  # loaded from disk
    written = load_file(str(tmp_path / "s" / "adapter_model.safetensors"))
    client.perturb(0.5, 1).result()
    assert client.samples_in_process and client.push_to_sampler().result() == 2
    assert all(torch.equal(written[k], v) for k, v in load_file(str(tmp_path / "s" / "adapter_model.safetensors")).items())
    engine.load_adapter("w", client.save_weights(tmp_path / "w").result())
    pushed, saved = engine.lora.adapters["s"], engine.lora.adapters["w"]
    assert pushed.keys() == saved.keys() and len(pushed) > 0
    assert all(torch.equal(pushed[m].a, saved[m].a) and torch.equal(pushed[m].b, saved[m].b) for m in pushed)
    svc.close()


async def _gather(engine, reqs):
    return await asyncio.gather(*(engine.generate(r) for r in reqs))


def test_get_tokenizer_is_the_base_models_as_in_tinker(service):
    # Tinker's TrainingClient.get_tokenizer: how a user turns text into a Datum's tokens
    c = service.create_lora_training_client("tok", LoraConfig(rank=4))
    tokenizer = c.get_tokenizer()
    assert tokenizer is service.loaded.tokenizer
    ids = tokenizer.encode("rock paper scissors", add_special_tokens=False)
    assert tokenizer.decode(ids) == "rock paper scissors"
    assert c.forward([Datum(ModelInput.from_ints(ids[:-1]), {"target_tokens": ids[1:]})], "cross_entropy").result().metrics["tokens"] == len(ids) - 1


def test_a_saved_state_file_damaged_since_is_a_value_error_naming_it(service, tmp_path):
    """--resume passes over a checkpoint whose state does not load (a ValueError); a state.json
    overwritten with other JSON was a KeyError, a file cut short pickle's or safetensors' error."""
    c = service.create_lora_training_client("damaged", LoraConfig(rank=4))
    for name, damage in (("state.json", b"{}"), ("optimizer.pt", b""), ("adapter_model.safetensors", b"\0" * 8)):
        c.save_state(tmp_path / name).result()
        (tmp_path / name / name).write_bytes(damage)
        with pytest.raises(ValueError, match=re.escape(f"{tmp_path / name / name} is damaged")):
            c.load_state(tmp_path / name).result()


def test_a_state_the_disk_has_no_room_for_is_an_os_error_naming_its_file_and_leaves_nothing(service, small_disk):
    """A full disk was torch's RuntimeError('unexpected pos') or a SafetensorError, naming no file:
    a traceback from `rolecast train` where one line belongs."""
    c = service.create_lora_training_client("full", LoraConfig(rank=4))
    for size, file in (("64k", "adapter_model.safetensors"), ("96k", "rng.pt")):  # room for the weights alone
        subprocess.run(["mount", "-o", f"remount,size={size}", small_disk], check=True)
        with pytest.raises(OSError) as refused:
            c.save_state(small_disk / "ckpt").result()
        where = Path(refused.value.filename)
        assert (refused.value.errno, where.name, where.parent.parent) == (errno.ENOSPC, file, small_disk)
        assert [p.name for p in small_disk.iterdir()] == ["fill"]


def test_a_state_saved_again_to_its_folder_replaces_it(service, tmp_path):
    """save_state over a folder that holds a state (a script checkpointing to one path) renames
    the new one into its place: a rename onto the folder fails (not empty)."""
    c = service.create_lora_training_client("again", LoraConfig(rank=4))
    c.save_state(tmp_path / "ckpt").result()
    c.perturb(0.1, 0).result()
    c.save_state(tmp_path / "ckpt").result()
    saved = c.adapter_state()
    c.perturb(0.1, 1).result()
    c.load_state(tmp_path / "ckpt").result()
    assert all(torch.equal(saved[k], v) for k, v in c.adapter_state().items())
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp dir left beside it


def test_a_state_of_another_lora_shape_is_refused_and_loads_nothing(service, tmp_path):
    """PEFT loads the weights whose names match and leaves the rest: a state of other target
    modules loaded nothing and returned its step, one of another alpha loaded at another scale,
    both without a word, and another rank was PEFT's traceback after the matching weights had loaded."""
    saved = service.create_lora_training_client("shape", LoraConfig(rank=4, target_modules=("q_proj", "o_proj")))
    saved.perturb(0.5, 0).result()
    saved.save_state(tmp_path / "ckpt").result()
    for i, lora in enumerate((LoraConfig(rank=4, target_modules=("v_proj", "o_proj")),
                              LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "o_proj")),
                              LoraConfig(rank=8, target_modules=("q_proj", "o_proj")))):
        c = service.create_lora_training_client(f"shape_{i}", lora)
        before = c.adapter_state()
        with pytest.raises(RolecastError, match=re.escape(
                f"{tmp_path / 'ckpt'} holds a LoRA of rank 4, alpha 32.0 on o_proj, q_proj; this adapter's is ")):
            c.load_state(tmp_path / "ckpt").result()
        assert c.step == 0 and all(torch.equal(before[k], v) for k, v in c.adapter_state().items())
    same = service.create_lora_training_client("shape_same", LoraConfig(rank=4, alpha=32, target_modules=("o_proj", "q_proj")))
    assert same.load_state(tmp_path / "ckpt").result() == 0
    assert all(torch.equal(saved.adapter_state()[k], v) for k, v in same.adapter_state().items())


def test_a_loaded_state_takes_the_next_step_the_saved_one_took(service, tmp_path):
    """load_state restores the adapter and Adam's moments: a step redone after it lands where it
    did first (a mutant leaving the optimizer's state out of the load passed every test here)."""
    c = service.create_lora_training_client("redo", LoraConfig(rank=4))
    c.perturb(0.1, 0).result()

    def step() -> dict[str, torch.Tensor]:
        c.forward_backward([datum()], "importance_sampling").result()
        c.optim_step(AdamParams(learning_rate=1e-2)).result()
        return c.adapter_state()

    step()
    c.save_state(tmp_path / "ckpt").result()
    first = step()
    assert c.load_state(tmp_path / "ckpt").result() == 1
    again = step()
    assert c.step == 2 and all(torch.allclose(first[k], again[k], rtol=0, atol=1e-7) for k in first)


def test_a_loaded_state_gives_back_the_rng_it_saved(service, tmp_path):
    """save_state keeps the RNG (torch's, Python's) beside the adapter: load_state sets it back,
    so the draws after a load are the draws after the save."""
    c = service.create_lora_training_client("rng_back", LoraConfig(rank=4))
    c.save_state(tmp_path / "ckpt").result()
    drawn = (torch.rand(4), random.random())
    c.load_state(tmp_path / "ckpt").result()
    again = (torch.rand(4), random.random())
    assert torch.equal(drawn[0], again[0]) and drawn[1] == again[1]


def test_a_checkpoint_of_the_unfused_optimizer_resumes(service, tmp_path):
    """Checkpoints written before the optimizer was fused (the step skip needs it) still load,
    into the fused optimizer, and train on."""
    c = service.create_lora_training_client("old", LoraConfig(rank=4))
    c.perturb(0.1, 0).result()
    c.forward_backward([datum()], "importance_sampling").result()
    c.optim_step(AdamParams(learning_rate=1e-2)).result()
    c.save_state(tmp_path / "ckpt").result()
    saved = torch.load(tmp_path / "ckpt" / "optimizer.pt", weights_only=False)
    for group in saved["param_groups"]:
        group["fused"] = None
    torch.save(saved, tmp_path / "ckpt" / "optimizer.pt")
    assert c.load_state(tmp_path / "ckpt").result() == 1
    assert all(g["fused"] for g in c.optimizer.param_groups)
    c.forward_backward([datum()], "importance_sampling").result()
    assert c.optim_step(AdamParams(learning_rate=1e-2)).result().metrics["skipped_step"] == 0.0


def test_every_call_has_an_async_variant_as_the_docs_say(service, tmp_path):
    """docs/training.md: each call's ``*_async`` returns a future with ``result_async()``; forward,
    load_state and save_weights had none (an AttributeError for a Tinker user's await)."""
    c = service.create_lora_training_client("async_all", LoraConfig(rank=4))

    async def go():
        fwd = await (await c.forward_async([datum()], "importance_sampling")).result_async()
        assert fwd.metrics["tokens"] > 0
        await (await c.save_state_async(tmp_path / "state")).result_async()
        assert await (await c.load_state_async(tmp_path / "state")).result_async() == 0
        assert await (await c.save_weights_async(tmp_path / "w")).result_async() == tmp_path / "w"

    asyncio.run(go())
