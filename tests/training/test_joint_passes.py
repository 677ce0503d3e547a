"""Several adapters' forward_backward calls in shared passes (``forward_backward_many``): each
call gets what it would get alone, and no gradient crosses from one adapter to another."""
from __future__ import annotations

import pytest
import torch

from orchestrator.training import Datum, LoraConfig, ModelInput, ServiceClient


@pytest.fixture(scope="module")
def service():
    svc = ServiceClient("tiny", bf16_autocast=False, joint_passes=True)  # fp32: the two ways agree to float rounding
    yield svc
    svc.close()


def datum(tokens: list[int], advantage: float, actions_from: int = 8) -> Datum:
    n = len(tokens) - 1
    return Datum(ModelInput.from_ints(tokens[:-1]), {
        "target_tokens": tokens[1:], "mask": [0.0] * actions_from + [1.0] * (n - actions_from),
        "logprobs": [-4.0] * n, "advantages": [advantage] * n})


def learners(service, names: list[str], ranks: list[int]):
    clients = []
    for seed, (name, rank) in enumerate(zip(names, ranks)):
        c = service.create_lora_training_client(name, LoraConfig(rank=rank))
        torch.manual_seed(seed)
        for p in c.params:  # non-zero B, and adapters unlike each other
            p.data.normal_(0, 0.05)
        clients.append(c)
    return clients


def grads(clients) -> list[list[torch.Tensor]]:
    out = [[p.grad.clone() if p.grad is not None else None for p in c.params] for c in clients]
    for c in clients:
        c.optimizer.zero_grad(set_to_none=True)
    return out


def close(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal to fp32 rounding at the tensor's scale (summation orders differ between the ways)."""
    return float((x - y).abs().max()) <= 1e-5 * float(x.abs().max()) + 1e-8


def test_calls_of_several_adapters_together_equal_each_alone(service):
    """Two adapters of different ranks; the same token sequences under both (they must not share
    a prefix across adapters); one adapter called twice at two temperatures; a KL term and an
    entropy bonus on some calls. One pass, then micro-batches of a few datums that mix adapters."""
    a, b = learners(service, ["joint_a", "joint_b"], [4, 8])
    opening = list(range(200, 230))
    seqs = [opening + [300 + k, 301 + k, 302 + k, 303 + k] for k in range(4)] + [list(range(400, 420))]
    data_a = [datum(s, 1.0 - 0.5 * k) for k, s in enumerate(seqs)]
    data_b = [datum(s, 0.3 * k - 0.4) for k, s in enumerate(seqs[:4])]
    data_a2 = [datum(opening + [500, 501, 502], 0.7)]
    calls = [(a, data_a, "ppo", {"kl_coef": 0.1}),
             (b, data_b, "importance_sampling", {"temperature": 0.7, "entropy_coef": 0.01}),
             (a, data_a2, "ppo", {"temperature": 0.5, "aggregation": "sequence-mean"})]
    alone = [c.forward_backward(d, f, o).result() for c, d, f, o in calls]
    g_alone = grads([a, b])
    for budget in (100_000, 120):
        service.micro_batch_tokens = budget
        together = service.forward_backward_many(calls).result()
        g_together = grads([a, b])
        for one, both in zip(alone, together):
            assert both.metrics.keys() == one.metrics.keys()
            assert all(both.metrics[k] == pytest.approx(v, rel=1e-5, abs=1e-6) for k, v in one.metrics.items())
            assert all(torch.allclose(x["logprobs"], y["logprobs"], atol=1e-5)
                       for x, y in zip(one.loss_fn_outputs, both.loss_fn_outputs))
        for per_adapter_alone, per_adapter_together in zip(g_alone, g_together):
            assert all(close(x, y) for x, y in zip(per_adapter_alone, per_adapter_together))
    service.micro_batch_tokens = 4096
    assert any(g.abs().sum() > 0 for g in g_alone[1])  # b learned from its own rows


def test_adapters_on_different_modules_together_equal_each_alone(service):
    """A module that holds only some of a pass's adapters adds its delta to those adapters' rows
    alone: ``part``'s rows (q_proj only) get no delta of ``full``'s in the other modules."""
    full = service.create_lora_training_client("mods_full", LoraConfig(rank=4))
    part = service.create_lora_training_client("mods_part", LoraConfig(rank=4, target_modules=("q_proj",)))
    torch.manual_seed(5)
    for p in full.params + part.params:
        p.data.normal_(0, 0.05)
    seqs = [list(range(200, 220)), list(range(300, 320))]
    calls = [(c, [datum(s, 1.0) for s in seqs], "cross_entropy", {}) for c in (full, part)]
    alone = [c.forward_backward(d, f, o).result() for c, d, f, o in calls]
    g_alone = grads([full, part])
    together = service.forward_backward_many(calls).result()
    for one, both in zip(alone, together):
        assert all(torch.allclose(x["logprobs"], y["logprobs"], atol=1e-5)
                   for x, y in zip(one.loss_fn_outputs, both.loss_fn_outputs))
    for per_adapter_alone, per_adapter_together in zip(g_alone, grads([full, part])):
        assert all(close(x, y) for x, y in zip(per_adapter_alone, per_adapter_together))


def test_micro_batches_mix_adapters_only_when_joint_and_never_cut_a_tree_for_another(service):
    seqs = [(1, 2, 3, 4), (1, 2, 3, 5), (9, 9), (1, 2, 3, 4)]
    adapters = ["y", "x", "x", "x"]
    service.micro_batch_tokens = 10_000
    assert service._micro_batches(seqs, adapters) == [[3, 1, 2, 0]]  # x's first, in token order, then y's
    service.joint_passes = False
    assert service._micro_batches(seqs, adapters) == [[3, 1, 2], [0]]
    service.joint_passes = True
    service.micro_batch_tokens = 7 * (1 + 4 / 512)  # x's three fit alone (7 new tokens); y's 4 more would not
    assert service._micro_batches(seqs, adapters) == [[3, 1, 2], [0]]
    service.micro_batch_tokens = 4096


def test_an_uninvolved_adapter_gets_no_gradient_and_a_bad_call_stops_the_pass(service):
    a, b, c = learners(service, ["bad_a", "bad_b", "bad_c"], [4, 4, 4])
    seq = list(range(100, 130))
    service.forward_backward_many([(a, [datum(seq, 1.0)], "ppo", {}), (b, [datum(seq, -1.0)], "ppo", {})]).result()
    assert all(p.grad is None for p in c.params)
    assert all(p.grad is not None for p in a.params + b.params)
    grads([a, b])
    with pytest.raises(ValueError, match="unknown loss_fn"):
        service.forward_backward_many([(a, [datum(seq, 1.0)], "ppo", {}), (b, [datum(seq, 1.0)], "dpo", {})]).result()
    assert all(p.grad is None for p in a.params + b.params)  # checked before any pass ran


def test_routed_adapters_compute_what_peft_computes(service):
    """The service adds LoRA deltas itself (``routing.py``); PEFT's own forward is the reference."""
    (c,) = learners(service, ["peft_ref"], [8])
    tokens = list(range(100, 140))
    d = datum(tokens, 1.0, actions_from=0)
    ours = c.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    with torch.no_grad():
        base = service.peft(input_ids=torch.tensor([tokens[:-1]])).logits[0]  # PEFT's layers are off
        service.peft.base_model.enable_adapter_layers()
        try:
            service.peft.set_adapter("peft_ref")
            logits = service.peft(input_ids=torch.tensor([tokens[:-1]])).logits[0]
        finally:
            service.peft.base_model.disable_adapter_layers()
    theirs = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1)
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert (logits - base).abs().max() > 1e-3  # the adapter does change the logits


def test_lora_dropout_applies_per_row_adapter(service):
    noisy = service.create_lora_training_client("drop_noisy", LoraConfig(rank=4, dropout=0.5))
    (still,) = learners(service, ["drop_still"], [4])
    for p in noisy.params:
        p.data.normal_(0, 0.05)
    seq = list(range(100, 130))
    calls = [(noisy, [datum(seq, 1.0)], "cross_entropy", {}), (still, [datum(seq, 1.0)], "cross_entropy", {})]
    first, second = service.forward_backward_many(calls).result(), service.forward_backward_many(calls).result()
    grads([noisy, still])
    logp = [[out.loss_fn_outputs[0]["logprobs"] for out in run] for run in (first, second)]
    assert not torch.equal(logp[0][0], logp[1][0])  # dropout draws anew each pass
    assert torch.equal(logp[0][1], logp[1][1])  # the adapter without dropout is deterministic


def test_lora_dropout_scales_what_it_keeps_by_one_over_the_keep_probability(service, monkeypatch):
    """As PEFT's (torch's) dropout: a delta's expected value is the adapter's own. With every input
    kept, dropout 0.5 doubles the delta: the logprobs of the same weights with B doubled."""
    (plain,) = learners(service, ["keep_plain"], [4])
    noisy = service.create_lora_training_client("keep_noisy", LoraConfig(rank=4, dropout=0.5))
    for p, q in zip(noisy.params, plain.params):
        p.data.copy_(q.data)
    for p in plain.lora_params("lora_B"):
        p.data.mul_(2)
    d = datum(list(range(100, 130)), 1.0, actions_from=0)
    monkeypatch.setattr(torch, "rand", lambda shape, device=None: torch.zeros(shape, device=device))  # keep all
    logp = [c.forward_backward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"] for c in (noisy, plain)]
    grads([noisy, plain])
    assert torch.allclose(logp[0], logp[1], atol=1e-5)


def test_forward_without_a_gradient_takes_no_lora_dropout(service):
    """``forward`` once drew dropout too: an adapter with dropout 0.5 gave other logprobs at each
    call, none of them the policy's (the engine samples without dropout)."""
    (plain,) = learners(service, ["drop_plain"], [4])
    noisy = service.create_lora_training_client("drop_eval", LoraConfig(rank=4, dropout=0.5))
    for p, q in zip(noisy.params, plain.params):
        p.data.copy_(q.data)
    d = datum(list(range(100, 130)), 1.0, actions_from=0)
    logp = [c.forward([d]).result().loss_fn_outputs[0]["logprobs"] for c in (noisy, noisy, plain)]
    assert torch.equal(logp[0], logp[1]) and torch.equal(logp[0], logp[2])


def test_the_defaults_follow_the_device():
    """On the CPU a pass is compute-bound: adapters pass apart and the prefix tree's passes cost
    about 30 tokens. (A GPU's defaults, joint passes and 4,096: tests/gpu.)"""
    service = ServiceClient("tiny")
    try:
        assert service.joint_passes is False and service.pass_tokens == 32
    finally:
        service.close()


def test_a_pass_told_it_costs_nothing_computes_each_prefix_once():
    """``pass_tokens=0`` (as the engine's CPU default): no shared opening is recomputed in its
    branches; it was taken for "not given" and became the CPU's 32."""
    service = ServiceClient("tiny", pass_tokens=0)
    try:
        assert service.pass_tokens == 0
    finally:
        service.close()


def test_an_adapter_named_like_a_module_holds_only_its_own_weights(service):
    """PEFT names a weight ``...mlp.up_proj.lora_A.<adapter>.weight``: an adapter called ``mlp``
    once took every other adapter's MLP weights too, into its optimizer, clipping and noise."""
    solver, mlp = (service.create_lora_training_client(name, LoraConfig(rank=4)) for name in ("solver", "mlp"))
    assert len(mlp.params) == len(solver.params) == 2 * 7 * 2  # 2 layers of the tiny model, 7 modules, A and B
    assert not {id(p) for p in mlp.params} & {id(p) for p in solver.params}
    assert len(mlp.lora_params("lora_A")) == len(mlp.params) // 2


def test_an_adapters_saved_weights_are_its_own_whatever_the_others_are_called(service, tmp_path):
    """PEFT's state dict drops every key that holds another adapter's name: beside an adapter
    called ``self_attn`` an adapter's file lacked its attention weights, and beside one called
    ``layers`` (in every key) it held every adapter's weights."""
    (kept,) = learners(service, ["kept"], [4])
    expected = {n.replace(".kept.", "."): p.detach() for n, p in service.peft.named_parameters() if ".kept." in n}
    assert len(expected) == len(kept.params)
    for other in ("self_attn", "layers"):
        service.create_lora_training_client(other, LoraConfig(rank=2))
        state = kept.adapter_state()
        assert state.keys() == expected.keys() and all(torch.equal(state[k], v) for k, v in expected.items())
    kept.save_state(tmp_path / "ckpt").result()
    saved = kept.adapter_state()
    for p in kept.params:
        p.data.zero_()
    kept.load_state(tmp_path / "ckpt").result()
    assert all(torch.equal(saved[k], v) for k, v in kept.adapter_state().items())
