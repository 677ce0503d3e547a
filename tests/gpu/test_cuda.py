"""The engine and the training client on a CUDA GPU (skipped where there is none: CI never has one).

Run on the lent machine (../shared/DEVICE.md): ``python -m pytest -q -m gpu tests/gpu``.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.models import load_model
from orchestrator.training.client import ServiceClient, TrainingClient
from orchestrator.training.types import AdamParams, Datum, LoraConfig, ModelInput
from support import assert_same_draws, generate_together, metric_rows, randomize, tiny_engine, train_recipe

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")]
CUDA = "cuda"


def requests(n: int, adapters=(None,), temperature: float = 1.0, max_tokens: int = 16):
    return [GenerationRequest(tuple(range(5, 12 + i % 5)), SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                                                           seed=i), adapters[i % len(adapters)])
            for i in range(n)]


def generate(engine, reqs):
    async def go():
        try:
            return await asyncio.gather(*(engine.generate(r) for r in reqs))
        finally:
            await engine.aclose()

    return asyncio.run(go())


@contextlib.contextmanager
def waits_recorded(syncs: list, skip: str = "/nowhere/"):
    """Runs its block under ``set_sync_debug_mode("warn")`` and appends to ``syncs`` where each wait
    came from (the Python line that called into torch), except lines in files whose path contains
    ``skip``. Only the waits' own warning counts: torch also warns, once a process, that the mode
    is a prototype, and that warning names no wait."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # only the checked thread warns meanwhile
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
            syncs.extend(f"{w.filename}:{w.lineno}: {w.message}" for w in caught
                         if "called a synchronizing CUDA operation" in str(w.message) and skip not in w.filename)


def test_the_engine_places_everything_on_the_gpu():
    engine = tiny_engine(device=CUDA)
    assert engine.device.type == "cuda" and next(engine.model.parameters()).is_cuda
    assert engine.decode_path == "static:graphs" and engine._kv.device.type == "cuda"
    outs = generate(engine, requests(8))
    assert [len(o.token_ids) for o in outs] == [16] * 8
    assert engine._kv.keys.is_cuda and engine._graphs.captured >= 1
    assert engine._chunk_graphs.captured >= 1  # the prompts' prefill, replayed from a graph too


def test_graph_replayed_and_eager_steps_sample_the_same_tokens():
    """Mixed adapters, rows joining and leaving (max_batch 6 < 20 requests, unequal budgets), and
    an adapter update between rounds: its weights are copied into the captured stacks in place.
    The newcomers' prefill (short prompts: a chunk over every slot) is replayed from graphs too."""
    outs = {}
    for graphs in (True, False):
        engine = tiny_engine(device=CUDA, max_batch=6, cuda_graphs=graphs)
        for seed, name in enumerate(("alpha", "beta"), 1):
            engine.add_adapter(name)
            randomize(engine, name, seed)
        reqs = [GenerationRequest(tuple(range(5, 9 + (i * 7) % 23)), SamplingParams(temperature=1.0, max_tokens=10 + i % 7,
                                                                                   seed=i), (None, "alpha", "beta")[i % 3])
                for i in range(20)]
        first = generate_together(engine, reqs)  # both paths see the same batches, however fast each is
        randomize(engine, "alpha", 5)
        second = generate_together(engine, reqs)
        asyncio.run(engine.aclose())
        outs[graphs] = [(o.token_ids, o.logprobs) for o in first + second]
        assert engine.decode_path == ("static:graphs" if graphs else "static:eager")
    assert [t for t, _ in outs[True]] == [t for t, _ in outs[False]]
    assert max(abs(a - b) for (_, x), (_, y) in zip(outs[True], outs[False]) for a, b in zip(x, y)) < 1e-4
    assert outs[True][:20] != outs[True][20:]  # the update reached the graphs


def test_a_steady_decode_step_never_waits_for_the_gpu(monkeypatch):
    """The static path books step t while the GPU computes step t+1: a blocking copy in a step (host
    data sent from pageable memory, ``.item()``) would make the host wait for the step it just
    launched (orchestrator/upload.py). Each step without newcomers runs under
    ``set_sync_debug_mode("warn")``; its warnings count unless the step captured a graph (a capture
    synchronises), and the second round of the same requests captures none. Rows with top-p and
    a row under a JSON schema (its bitmask applied on the GPU) are among them."""
    import dataclasses

    from orchestrator.engines.hf import HFEngine
    from orchestrator.messages import schema_json

    engine = tiny_engine("bfloat16", device=CUDA, max_batch=8)
    engine.add_adapter("alpha")
    randomize(engine, "alpha", 1)
    reqs = requests(8, adapters=(None, "alpha"), max_tokens=24)
    reqs[1:3] = [dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, top_p=0.9)) for r in reqs[1:3]]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    reqs[3] = dataclasses.replace(reqs[3], json_schema=schema_json(schema))
    iterate, checked_steps, syncs = HFEngine._static_iteration, [], []

    def checked(self, newcomers):
        if newcomers:
            return iterate(self, newcomers)
        captured, waits = self._graphs.captured, []
        with waits_recorded(waits):
            iterate(self, newcomers)
        if self._graphs.captured == captured:
            checked_steps.append(len(self._active))
            syncs.extend(waits)

    monkeypatch.setattr(HFEngine, "_static_iteration", checked)

    async def rounds():
        for _ in range(2):
            await asyncio.gather(*(engine.generate(r) for r in reqs))
        await engine.aclose()

    asyncio.run(rounds())
    assert len(checked_steps) >= 20, checked_steps
    assert syncs == [], "\n".join(dict.fromkeys(syncs))


def test_the_static_path_samples_what_the_batch_kv_path_samples_on_cuda():
    outs = {}
    for static in (True, False):
        engine = tiny_engine(device=CUDA, max_batch=6, static=static)
        engine.add_adapter("alpha")
        randomize(engine, "alpha", 1)
        outs[static] = [(o.token_ids, o.logprobs) for o in generate(engine, requests(12, adapters=(None, "alpha")))]
    assert_same_draws(outs[True], outs[False], tolerance=1e-3)


@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-3), ("bfloat16", 0.1)])
def test_sampling_logprobs_equal_teacher_forcing_on_cuda(dtype, tolerance):
    """Within 1e-3 in fp32 (TF32 and fused kernels reorder sums), 0.1 in bf16."""
    engine = tiny_engine(dtype, device=CUDA)
    engine.add_adapter("alpha")
    randomize(engine, "alpha", 1)
    reqs = requests(6, adapters=(None, "alpha"), temperature=0.7)

    async def go():  # teacher forcing before the engine closes: closing takes its adapters off the model
        outs = await asyncio.gather(*(engine.generate(r) for r in reqs))
        refs = [engine.teacher_forced_logprobs(list(r.prompt_ids), o.token_ids, r.adapter, 0.7) for r, o in zip(reqs, outs)]
        await engine.aclose()
        return outs, refs

    for out, ref in zip(*asyncio.run(go())):
        assert len(ref) == len(out.logprobs) > 0
        assert max(abs(a - b) for a, b in zip(ref, out.logprobs)) < tolerance


def test_a_mixed_adapter_batch_equals_single_adapter_runs():
    def run(adapters, reqs):
        engine = tiny_engine(device=CUDA)
        for seed, name in enumerate(("alpha", "beta"), 1):
            engine.add_adapter(name)
            randomize(engine, name, seed)
        return [(o.token_ids, o.logprobs) for o in generate(engine, reqs)]

    mixed = requests(8, adapters=(None, "alpha", "beta"))
    together = run(None, mixed)
    alone = [run(None, [r])[0] for r in mixed]
    assert_same_draws(together, alone, tolerance=1e-3)


def test_both_decode_paths_sample_the_same_tokens():
    outs = {}
    for fused in (True, False):
        engine = tiny_engine(device=CUDA, fused_decode=fused, static=False)
        outs[fused] = [(o.token_ids, o.logprobs) for o in generate(engine, requests(6))]
    assert_same_draws(outs[True], outs[False], tolerance=1e-3)


def test_a_training_step_on_cuda_moves_only_the_trained_adapter():
    service = ServiceClient(load_model("tiny", dtype="float32", seed=0), device=CUDA)
    try:
        assert service.joint_passes and service.pass_tokens == 4096  # a GPU's defaults: its passes cost their launches
        a = service.create_lora_training_client("a", LoraConfig(rank=4))
        b = service.create_lora_training_client("b", LoraConfig(rank=4))
        before_a, before_b = a.adapter_state(), b.adapter_state()
        toks = list(range(100, 121))
        datum = Datum(ModelInput.from_ints(toks[:-1]), {"target_tokens": toks[1:], "mask": [0.0] * 6 + [1.0] * 14,
                                                         "logprobs": [-5.0] * 20, "advantages": [1.0] * 20})
        out = a.forward_backward([datum], "importance_sampling").result()
        assert out.loss_fn_outputs[0]["logprobs"].device.type == "cpu" and out.metrics["tokens"] == 14
        a.optim_step(AdamParams(learning_rate=1e-2)).result()
        after_b = b.adapter_state()
        assert len(after_b) == len(before_b) > 0 and all(torch.equal(before_b[k], v) for k, v in after_b.items())
        assert any(not torch.equal(before_a[k], v) for k, v in a.adapter_state().items())
    finally:
        service.close()


def test_a_training_call_never_waits_for_the_gpu(monkeypatch):
    """A forward_backward (the prefix tree's waves, two adapters routed in one pass, the LM head,
    the loss with its entropy and KL terms, the metrics, the outputs) and an optim_step with
    clipping queue their work without waiting for the GPU: indices are worked out on the host, data
    goes up from pinned memory and results come back in a ``Download`` (orchestrator/upload.py),
    waited for where the caller reads them. One wait is transformers', not ours, and is left out:
    at the start of each forward its SDPA mask code reads whether the padding mask is all ones
    (``masking_utils._ignore_causal_mask_sdpa``)."""
    service = ServiceClient(load_model("tiny", dtype="float32", seed=0), device=CUDA)
    clients = [service.create_lora_training_client(name, LoraConfig(rank=4)) for name in ("a", "b")]
    prompt = list(range(100, 140))
    data = []
    for i in range(6):  # a shared prompt, replies of two lengths
        toks = prompt + list(range(200 + i, 200 + i + 8 + 8 * (i % 2)))
        n = len(toks) - 1
        data.append(Datum(ModelInput.from_ints(toks[:-1]), {"target_tokens": toks[1:], "mask": [0.0] * 39 + [1.0] * (n - 39),
                                                             "logprobs": [-5.0] * n, "advantages": [0.5 - i % 2] * n}))
    config = {"entropy_coef": 0.01, "kl_coef": 0.05}
    calls = [(c, data, "ppo", config) for c in clients]
    passes, optim_step, syncs = ServiceClient._passes, TrainingClient._optim_step, []

    def checked(method):
        def run(*args):
            with waits_recorded(syncs, skip="transformers/masking_utils.py"):  # the service's thread alone works
                return method(*args)
        return run

    adam = AdamParams(learning_rate=1e-3, grad_clip_norm=1.0)
    try:
        service.forward_backward_many(calls).result()  # the first calls' lazy set-up is not checked
        clients[0].optim_step(adam).result()
        monkeypatch.setattr(ServiceClient, "_passes", checked(passes))
        monkeypatch.setattr(TrainingClient, "_optim_step", checked(optim_step))
        outs = service.forward_backward_many(calls).result()
        step = clients[0].optim_step(adam).result()
        service.close()  # every job has run, so every wait would have been recorded by now
        assert syncs == [], "\n".join(dict.fromkeys(syncs))
    finally:
        service.close()
    assert [o.metrics["tokens"] for o in outs] == [sum(len(d.model_input.to_ints()) - 39 for d in data)] * 2
    assert outs[0].loss_fn_outputs[0]["logprobs"].device.type == "cpu"
    assert step.step == 2 and step.metrics["grad_norm"] > 0


def test_kill_then_resume_on_cuda(tmp_path):
    run = tmp_path / "run"
    args = [sys.executable, "-m", "orchestrator.cli", "train", str(train_recipe(tmp_path, 4)), "--out", str(run),
            "--no-progress", "--device", CUDA]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    latest = run / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]  # still running: a checkpoint, then the kill
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = latest.read_text().strip()
    resumed = subprocess.run(args + ["--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed" in resumed.stderr and f"step={int(done.split('-')[1])}" in resumed.stderr
    train_steps = [r["step"] for r in metric_rows(run) if r["kind"] == "train"]
    assert train_steps[-1] == 4 and train_steps == sorted(set(train_steps))  # each step once
    on_cpu = [a if a != CUDA else "cpu" for a in args] + ["--resume", "--steps", "5"]  # the optimizer's CUDA moments
    resumed = subprocess.run(on_cpu, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert [r["step"] for r in metric_rows(run) if r["kind"] == "train"][-1] == 5


def test_rolecast_train_shares_the_engines_base_weights_on_cuda(tmp_path):
    """One copy of the base weights; and after the engine has served the trained adapter (its
    weights non-zero), the next training passes see none of the engine's routing (the crash of
    tests/training/test_losses.py's shared-service test, here with bf16 and graphs)."""
    engine = tiny_engine("bfloat16", device=CUDA)
    service = ServiceClient.for_engine(engine, "tiny", bf16_autocast=True)
    before = torch.cuda.memory_allocated()
    client = service.create_lora_training_client("s", LoraConfig(rank=4))
    assert service.shared and service.loaded is engine.loaded and next(engine.model.parameters()).dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in client.params)  # LoRA and its optimizer state in fp32
    assert torch.cuda.memory_allocated() - before < 0.1 * sum(p.numel() * 2 for p in engine.model.parameters())
    toks = list(range(100, 121))
    datum = Datum(ModelInput.from_ints(toks[:-1]), {"target_tokens": toks[1:], "mask": [0.0] * 6 + [1.0] * 14,
                                                     "logprobs": [-5.0] * 20, "advantages": [1.0] * 20})
    first = client.forward_backward([datum], "importance_sampling").result()
    assert first.metrics["tokens"] == 14
    service.attach_engine(engine)
    client.perturb(0.5, 1).result()
    client.save_weights_for_sampler(tmp_path / "s").result()
    before_rollout = client.forward([datum], "importance_sampling").result()
    for _ in range(2):
        outs = asyncio.run(_gather(engine, requests(4, adapters=("s", None))))
        assert [len(o.token_ids) for o in outs] == [16] * 4
    after = client.forward_backward([datum], "importance_sampling").result()
    assert torch.allclose(after.loss_fn_outputs[0]["logprobs"], before_rollout.loss_fn_outputs[0]["logprobs"], atol=1e-3)
    asyncio.run(engine.aclose())


async def _gather(engine, reqs):
    return await asyncio.gather(*(engine.generate(r) for r in reqs))


@pytest.mark.parametrize("script", ["rollout", "train", "joint_passes", "grpo_vs_trl", "logprob_head"])
def test_device_benchmarks_run_their_smoke_on_cuda(script):
    """The benchmarks that take ``--device``: their GPU paths (CUDA graphs, the shared-weights
    service) run end to end, as tests/test_benchmarks.py runs their CPU paths."""
    import importlib.util
    import json
    from pathlib import Path

    if script == "grpo_vs_trl" and importlib.util.find_spec("trl") is None:
        pytest.skip("TRL is not installed")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / f"{script}.py"), "--smoke", "--device", CUDA],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "cuda" in str(out["device"]).lower() or str(out["device"]).startswith("NVIDIA"), out["device"]
