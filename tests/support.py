"""Helpers the tests import (conftest.py modules are not importable by name across folders)."""
from __future__ import annotations

import asyncio
import re
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from orchestrator.cpu import CpuFeatures

ROOT = Path(__file__).resolve().parents[1]  # the repository
ERROR_LINE = re.compile(r"^(?P<file>[^:\n]+)(?::(?P<line>\d+))?: (?P<key>\S+): (?P<problem>.+)$")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def _bf16_runs() -> bool:
    try:
        torch.ones(2, 2, dtype=torch.bfloat16) @ torch.ones(2, 2, dtype=torch.bfloat16)
        return True
    except RuntimeError:
        return False


# bf16-only tests: skipped, with the reason, on a CPU where torch cannot multiply bf16 at all
requires_bf16 = pytest.mark.skipif(not _bf16_runs(), reason="torch cannot run bf16 matmuls on this CPU")

# Other machines' CPUs, handed to the engine so every weight layout runs on this one (cpu.py)
AVX512 = CpuFeatures(frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}))
AVX2 = CpuFeatures(frozenset({"avx2", "fma"}))  # an AMD EPYC of this project's: no oneDNN bf16 kernels
NO_ONEDNN = CpuFeatures(frozenset({"avx2"}), onednn=False)


def assert_same_draws(outs, refs, tolerance: float = 1e-4):
    """``outs`` and ``refs``, lists of (token ids, logprobs) from two engine paths over the tiny
    model, hold the same tokens, with logprobs within ``tolerance``, but for rounding at a token
    boundary. The tiny random model's next-token distribution is nearly flat (49k tokens, none
    above 1e-4), so the rounding of two kernels (or of one kernel on another thread count) can move
    an inverse-CDF draw to the neighbouring token id; a row's text parts there. A wrong uniform,
    adapter or cache would pick an unrelated token instead, and would not stay rare."""
    assert len(outs) == len(refs)
    parted = 0
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(outs, refs):
        same = next((j for j, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), None)
        assert max((abs(a - b) for a, b in zip(logprobs[:same], ref_logprobs[:same])), default=0) < tolerance
        if same is None:
            assert len(tokens) == len(ref_tokens)
        else:
            assert abs(tokens[same] - ref_tokens[same]) == 1, (same, tokens, ref_tokens)
            parted += 1
    assert parted <= max(1, len(refs) // 8), f"{parted} of {len(refs)} rows parted"


def generate_together(engine, requests):
    """``engine``'s completions of ``requests``, all admitted by one scheduler iteration: its compute
    thread is held until every request is queued. Submitted plainly, a loaded machine's scheduler
    may admit the first before the rest are queued, and a batch of other rows rounds its bf16
    matmuls apart (docs/engine.md, Sampling): tests that compare two engines' samples need both to
    see the same batches."""
    async def go():
        gate = threading.Event()
        engine._compute.submit(gate.wait)
        tasks = [asyncio.create_task(engine.generate(r)) for r in requests]
        while engine.busy < len(requests):
            await asyncio.sleep(0.01)
        gate.set()
        return await asyncio.gather(*tasks)

    return asyncio.run(go())


def no_engine():
    """The engine factory of tests that bind no role to the model."""
    raise AssertionError("no role here should need the model")


def tiny_engine(dtype: str = "float32", seed: int = 0, device: str = "cpu", **options):
    """The HF engine over the tiny random model (real tokenizer)."""
    from orchestrator.engines.hf import HFEngine
    from orchestrator.models import load_model

    return HFEngine(load_model("tiny", dtype=dtype, seed=seed, device=device), **options)


def lora_state(model: torch.nn.Module, seed: int, rank: int = 4, std: float = 1.0,
               modules: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """A PEFT-format state dict with random A and B for ``model``'s linears (all but the LM head,
    or those whose names end with one of ``modules``); ``std`` 0 gives zeros."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear) or name.endswith("lm_head"):
            continue
        if modules is None or name.endswith(modules):
            state[f"base_model.model.{name}.lora_A.weight"] = torch.randn(rank, m.in_features, generator=g) * std
            state[f"base_model.model.{name}.lora_B.weight"] = torch.randn(m.out_features, rank, generator=g) * std
    return state


def peft_dir(folder: Path, state: dict[str, torch.Tensor], alpha: float | None = None) -> Path:
    """An adapter dir as PEFT writes one (weights and the config rolecast reads), for ``state``."""
    import json

    from safetensors.torch import save_file

    rank = next(v.shape[0] for k, v in state.items() if k.endswith("lora_A.weight"))
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": alpha or 2 * rank}))
    return folder


def make_attempt(prompt_ids=None, token_ids=None, logprobs=None, *, valid: bool = True, text: str = "",
                 messages=(), finish_reason: str | None = None):
    from orchestrator.transcript import Attempt

    return Attempt(messages=list(messages), text=text, valid=valid, errors=[], prompt_ids=prompt_ids,
                   token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason)


def make_episode(*turns, rewards: dict[str, float] | None = None, outcome: dict | None = None):
    """An episode record of ``turns``: (role, attempts) or (role, attempts, content) each."""
    from orchestrator.transcript import EpisodeRecord, Turn

    ep = EpisodeRecord(id="e", index=0, team="t", task={}, seed=0, rewards=rewards or {}, outcome=outcome or {})
    for i, (role, attempts, *content) in enumerate(turns):
        valid = attempts[-1].valid if attempts else True
        ep.turns.append(Turn(turn=i, role=role, message_id=f"e:{i}", content=content[0] if content else None,
                             valid=valid, retries=max(len(attempts) - 1, 0), penalty=0.0, attempts=list(attempts)))
    return ep


def randomize(engine, name: str, seed: int) -> int:
    """Give ``engine``'s adapter ``name`` random non-zero weights, so it really differs from the base."""
    return engine.update_adapter(name, lora_state(engine.model, seed, std=0.5))


TRAIN_RECIPE = """
name: tiny_debate
protocol: {type: debate, debaters: [pro, con], judge: judge, rounds: 1}
roles:
  - {use: debater, name: pro, params: {stance: for}, policy: {adapter: pro, sampling: {max_tokens: 6}}, max_retries: 0}
  - {use: debater, name: con, params: {stance: against}, policy: {adapter: con, sampling: {max_tokens: 6}}, max_retries: 0}
  - {use: judge, policy: {sampling: {max_tokens: 6}}, max_retries: 0}
tasks: [{topic: "Cats are better than dogs."}, {topic: "Tea is better than coffee."}]
model: tiny
training:
  trainer: grpo
  steps: {steps}
  group_size: 2
  groups_per_step: 1
  eval_every: 0
  eval_episodes: 2
  checkpoint_every: 1
  keep_checkpoints: 2
  adam: {learning_rate: 1.0e-3}
"""


def train_recipe(tmp_path: Path, steps: int) -> Path:
    """A two-debater recipe on the tiny model that trains ``steps`` steps, checkpointing each."""
    return write(tmp_path / "recipe.yaml", TRAIN_RECIPE.replace("{steps}", str(steps)))


def metric_rows(run: Path) -> list[dict]:
    """The rows of a training run's metrics.jsonl."""
    import json

    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


SMALL_TRAINING = ["--set", "group_size=2", "--set", "groups_per_step=1", "--set", "eval_episodes=2", "--set", "eval_every=0"]


def train_tiny(cli, recipe: Path, out: Path, steps: int, *extra: str) -> None:
    """``rolecast train`` on the tiny model with small groups and no evaluation between steps;
    ``extra`` flags come last, so they override those."""
    code, _, err = cli("train", recipe, "--model", "tiny", "--steps", str(steps), "--out", out, "--no-progress",
                       "--dtype", "float32", *SMALL_TRAINING, *extra)
    assert code == 0, err


def credit(run: Path, step: int) -> list[dict]:
    """The rows of a training run's rollouts/step-N/credit.jsonl."""
    import json

    lines = (run / "rollouts" / f"step-{step:06d}" / "credit.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def plugin(**hooks):
    """An in-memory plugin module: ``hooks`` (hook name -> function), each marked as a hookimpl."""
    from types import SimpleNamespace

    from orchestrator.hookspecs import hookimpl

    return SimpleNamespace(**{name: hookimpl(fn) for name, fn in hooks.items()})


def _sandbox_here() -> bool:
    import os

    from sandboxes import available_backends

    return os.geteuid() == 0 and bool(available_backends())


# tests that run a team's code: the sandbox needs root and bwrap or unshare
needs_sandbox = pytest.mark.skipif(not _sandbox_here(), reason="the sandbox needs root and bwrap or unshare")


class Killed(BaseException):
    """The process dying, as a test plays it (no ``except Exception`` of the code under test stops it)."""


def killed_writing(monkeypatch, name: str) -> None:
    """A file whose name holds ``name``, opened for writing, gets the first half of what is written
    to it, then the process dies (Killed): a kill while that file was written."""
    import builtins
    import io
    import os

    real = io.open

    class Half:
        def __init__(self, fh):
            self.fh = fh

        def write(self, data):
            self.fh.write(data[: len(data) // 2])
            self.fh.close()
            raise Killed

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def __getattr__(self, attr):
            return getattr(self.fh, attr)

    def opener(file, mode="r", *args, **kwargs):
        fh = real(file, mode, *args, **kwargs)
        writing = isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax")
        return Half(fh) if writing and name in os.path.basename(file) else fh

    monkeypatch.setattr(io, "open", opener)
    monkeypatch.setattr(builtins, "open", opener)
