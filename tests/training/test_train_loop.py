"""`rolecast train` end to end on the tiny model: metrics, checkpoints, sampler refresh, resume."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from support import metric_rows as rows
from support import Killed, killed_writing, tiny_engine, train_tiny, write
from support import train_recipe as recipe

def train(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "train", *args, "--no-progress", "--dtype", "float32"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_train_writes_metrics_checkpoints_and_refreshes_the_sampler(tmp_path):
    run = tmp_path / "run"
    proc = train(str(recipe(tmp_path, 2)), "--out", str(run))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    metrics = rows(run)
    assert [(r["kind"], r["step"]) for r in metrics] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    step1, step2 = metrics[1], metrics[2]
    for adapter in ("pro", "con"):
        assert step1[f"{adapter}/version"] == 2 and step2[f"{adapter}/version"] == 3  # 1 = initial publish
        assert step1[f"{adapter}/datums"] > 0
        assert step1[f"{adapter}/ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # on-policy
    assert "judge/version" not in step1  # not trainable
    for r, step in ((step1, 1), (step2, 2)):  # what the engine did for the step's rollout
        generated = json.loads((run / "rollouts" / f"step-{step:06d}" / "summary.json").read_text())["generated_tokens"]
        assert r["engine/prefill_tokens"] > 0 and r["engine/prefill_s"] > 0 and r["engine/prefill_passes"] > 0
        assert 0 < r["engine/decode_tokens"] <= generated  # a reply's first token comes from its prefill
    assert (run / "checkpoints" / "latest").read_text() == "step-000002"
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000001", "step-000002"]
    assert (run / "config.yaml").exists() and list((run / "tb").iterdir())
    # the sampler copy is what the latest step trained
    trained = load_file(str(run / "checkpoints" / "step-000002" / "adapters" / "pro" / "adapter_model.safetensors"))
    sampler = load_file(str(run / "sampler" / "pro" / "adapter_model.safetensors"))
    assert trained.keys() == sampler.keys() and len(trained) > 0
    assert all(torch.equal(trained[k], sampler[k]) for k in trained)
    report = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(run), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)
    assert any(p.endswith("reward.png") for p in summary["plots"]) and "pro" in summary["eval"]
    # a second fresh run into the same dir would mix its metrics with these: refused, nothing touched
    again = train(str(recipe(tmp_path, 2)), "--out", str(run))
    _, err = again.communicate(timeout=300)
    assert again.returncode == 2 and "already holds a training run" in err and "--resume" in err
    assert len(rows(run)) == len(metrics)


def test_the_last_step_is_evaluated_once_and_only_the_newest_checkpoints_are_kept(cli, tmp_path):
    """eval_every dividing the steps: the last step's evaluation is the final one, not a second
    row beside it; keep_checkpoints: the older checkpoints are deleted."""
    from support import train_tiny

    run = tmp_path / "run"
    train_tiny(cli, Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml", run, 2,
               "--set", "eval_every=1", "--set", "checkpoint_every=1", "--set", "keep_checkpoints=1")
    assert [(r["kind"], r["step"]) for r in rows(run)] == [("eval", 0), ("train", 1), ("eval", 1), ("train", 2), ("eval", 2)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000002"]


def test_the_engine_takes_each_steps_weights_and_the_sampler_dir_is_written_at_checkpoints(cli, tmp_path, monkeypatch):
    """The HF engine holds the adapters in this process: each step's weights reach it with no
    file written, and the run's sampler dirs are written when it starts and at each checkpoint,
    the last one the final step's."""
    from orchestrator.training.client import TrainingClient

    run, written = tmp_path / "run", []
    write_adapter = TrainingClient._write_adapter

    def counted(self, folder):
        written.append((self.name, Path(folder).relative_to(run).parts[0]))
        return write_adapter(self, folder)

    monkeypatch.setattr(TrainingClient, "_write_adapter", counted)
    code, _, err = cli("train", recipe(tmp_path, 3), "--out", run, "--no-progress", "--dtype", "float32",
                       "--set", "checkpoint_every=2")
    assert code == 0, err
    steps = [r for r in rows(run) if r["kind"] == "train"]
    for adapter in ("pro", "con"):
        assert [r[f"{adapter}/version"] for r in steps] == [2, 3, 4]  # 1 = the first publish
        # the start, then steps 2 and 3 (checkpoints); the checkpoints hold their own copies
        assert [where for name, where in written if name == adapter] == ["sampler"] + ["sampler", "checkpoints"] * 2
        final = load_file(str(run / "checkpoints" / "step-000003" / "adapters" / adapter / "adapter_model.safetensors"))
        sampler = load_file(str(run / "sampler" / adapter / "adapter_model.safetensors"))
        assert final.keys() == sampler.keys() and all(torch.equal(final[k], sampler[k]) for k in final)


def test_a_kill_while_the_sampler_dir_is_written_leaves_its_last_weights_whole(tmp_path, monkeypatch):
    """The sampler dir is the run's trained adapter (`--adapter pro=RUN/sampler/pro`), and what
    engines and rollout workers load from disk: a process killed while it rewrote it at a checkpoint
    left half a safetensors file there ("incomplete metadata") until a --resume."""
    from orchestrator.training.client import ServiceClient
    from orchestrator.training.types import LoraConfig

    service = ServiceClient("tiny")
    try:
        client = service.create_lora_training_client("pro", LoraConfig(rank=2))
        folder = tmp_path / "sampler" / "pro"
        client.save_weights(folder).result()
        before = load_file(str(folder / "adapter_model.safetensors"))
        killed_writing(monkeypatch, "adapter_model.safetensors")  # half the file on disk, then the process dies
        with torch.no_grad():
            for param in client.lora_params():
                param.add_(1.0)
        with pytest.raises(Killed):
            client.save_weights(folder).result()
        after = load_file(str(folder / "adapter_model.safetensors"))
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
        monkeypatch.undo()
        config = (folder / "adapter_config.json").read_text()
        killed_writing(monkeypatch, "adapter_config.json")  # half a JSON file: the dir no longer loads
        with pytest.raises(Killed):
            client.save_weights(folder).result()
        assert (folder / "adapter_config.json").read_text() == config
    finally:
        service.close()


def test_lora_target_modules_the_model_lacks_are_one_line():
    """``--set lora.target_modules=[q_prj]``: which names a model has, only it says; PEFT's
    NoMatchingPeftModuleError had been a traceback. An empty list is refused as a recipe's is."""
    from orchestrator.errors import RolecastError
    from orchestrator.training.client import ServiceClient
    from orchestrator.training.types import LoraConfig

    service = ServiceClient("tiny")
    try:
        linears = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
        with pytest.raises(RolecastError, match=re.escape(f"q_prj names no linear layer of tiny (its linear layers: {linears})")):
            service.create_lora_training_client("pro", LoraConfig(rank=2, target_modules=("q_prj",)))
        with pytest.raises(ValueError, match=r"LoraConfig.target_modules: List should have at least 1 item"):
            service.create_lora_training_client("pro", LoraConfig(rank=2, target_modules=()))
        # one typo beside a right name: PEFT wrapped q_proj alone and trained it, said nowhere
        service.create_lora_training_client("pro", LoraConfig(rank=2, target_modules=("q_proj",)))
        with pytest.raises(RolecastError, match=re.escape(f"lora.target_modules: v_prj names no linear layer of tiny "
                                                          f"(its linear layers: {linears})")):
            service.create_lora_training_client("con", LoraConfig(rank=2, target_modules=("q_proj", "v_prj")))
        # a module that is no linear layer (or holds them): PEFT's ValueError, a traceback printing the module
        for target in ("mlp", "input_layernorm", "layers"):
            with pytest.raises(RolecastError, match=re.escape(f"lora.target_modules: {target} names no linear layer of tiny "
                                                              f"(its linear layers: {linears})")):
                service.create_lora_training_client("con", LoraConfig(rank=2, target_modules=("q_proj", target)))
    finally:
        service.close()


def test_a_kill_while_a_training_runs_config_is_written_leaves_no_half_config(tmp_path, monkeypatch):
    # a half config.yaml: --resume and `rolecast report` call the dir no rolecast run
    from types import SimpleNamespace

    from orchestrator.launch import recorded_run
    from orchestrator.team import load_team
    from orchestrator.training.loop import TrainingRun

    run = SimpleNamespace(team=load_team(recipe(tmp_path, 1)), steps=1, run_dir=tmp_path,
                          options=SimpleNamespace(seed=0, model="tiny", dtype="float32", extra={}))
    killed_writing(monkeypatch, "config.yaml")
    with pytest.raises(Killed):
        TrainingRun._write_config(run)
    monkeypatch.undo()
    assert recorded_run(tmp_path) is None


def test_a_checkpoint_is_on_disk_before_it_counts(tmp_path, monkeypatch):
    """trainer.json, rng.pt, the checkpoint's dir and its rename into place were left to the page
    cache: a power loss after the older checkpoints were pruned could leave none whole."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from orchestrator.training.loop import TrainingRun

    def save_state(path):
        write(path / "state.json", "{}")
        done = Future()
        done.set_result(path)
        return done

    run = SimpleNamespace(_write_samplers=lambda: None, run_dir=tmp_path, clients={"pro": SimpleNamespace(save_state=save_state)},
                          cfg=SimpleNamespace(trainer="grpo", keep_checkpoints=2), published={},
                          trainer=SimpleNamespace(state_dict=lambda: {}))
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))[1])
    final = TrainingRun.checkpoint(run, 1)
    tmp = next(Path(p) for p in synced if Path(p).name.startswith(".step-000001.tmp-"))  # renamed since
    assert {str(tmp / "trainer.json"), str(tmp / "rng.pt"), str(tmp), str(final.parent)} <= set(synced), synced
    assert synced.index(str(final.parent)) > synced.index(str(tmp))  # after the rename


def test_sigkill_then_resume_continues_after_the_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    path = recipe(tmp_path, 4)
    proc = train(str(path), "--out", str(run))
    latest = run / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and not (latest.exists() and latest.read_text() == "step-000002"):
        time.sleep(0.2)
    assert latest.exists(), proc.stderr.read() if proc.poll() is not None else "no checkpoint in time"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = latest.read_text()
    saved = load_file(str(run / "checkpoints" / done / "adapters" / "con" / "adapter_model.safetensors"))
    opt = torch.load(run / "checkpoints" / done / "adapters" / "con" / "optimizer.pt", weights_only=False)

    _check_resume_restores_the_checkpoint(path, run, done)
    resumed = train(str(path), "--out", str(run), "--resume")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    k = int(done.split("-")[1])
    assert "resumed" in err and f"step={k}" in err
    train_steps = [r["step"] for r in rows(run) if r["kind"] == "train"]
    assert train_steps == [1, 2, 3, 4][: len(train_steps)] and train_steps[-1] == 4  # each step once
    # the versions go on from the checkpoint's, as without the kill: no number names two sets of weights
    assert [r["pro/version"] for r in rows(run) if r["kind"] == "train"] == [2, 3, 4, 5]
    assert (latest.read_text()) == "step-000004"
    state = json.loads((run / "checkpoints" / "step-000004" / "adapters" / "con" / "state.json").read_text())
    assert state["step"] == 4  # the optimizer's step count went on from the checkpoint's
    assert opt["state"], "the checkpoint carried optimizer moments"
    assert saved  # the weights the resumed run started from were on disk


def _check_resume_restores_the_checkpoint(path: Path, run: Path, done: str) -> None:
    """In-process: after _resume(), adapter, optimizer, step and RNG equal the checkpoint's."""
    import asyncio

    from orchestrator.team import load_team
    from orchestrator.training.client import ServiceClient
    from orchestrator.training.loop import TrainingRun, TrainOptions

    engine = tiny_engine()
    service = ServiceClient("tiny")
    service.attach_engine(engine)
    try:
        tr = TrainingRun(load_team(path), TrainOptions(out_dir=run, model="tiny", resume=True), engine, service)
        step = asyncio.run(tr._resume()) - 1  # it returns the first step still to run
        assert f"step-{step:06d}" == done
        folder = run / "checkpoints" / done / "adapters"
        assert sorted(tr.clients) == ["con", "pro"]
        for adapter, client in tr.clients.items():
            saved = load_file(str(folder / adapter / "adapter_model.safetensors"))
            now = client.adapter_state()
            assert saved.keys() == now.keys() and all(torch.equal(saved[k], now[k]) for k in saved)
            opt = torch.load(folder / adapter / "optimizer.pt", weights_only=False)
            live = client.optimizer.state_dict()
            assert opt["state"].keys() == live["state"].keys()
            assert all(torch.equal(opt["state"][i]["exp_avg"], live["state"][i]["exp_avg"]) for i in opt["state"])
            assert client.step == step
        rng = torch.load(run / "checkpoints" / done / "rng.pt", weights_only=False)
        assert torch.equal(torch.get_rng_state(), rng["torch"])
        published = json.loads((run / "checkpoints" / done / "trainer.json").read_text())["published"]
        assert engine.adapter_version("pro") == published["pro"]  # the restored weights, under their number
    finally:
        asyncio.run(engine.aclose())
        service.close()


SQUARES = "{type: object, properties: {move: {enum: [a1, b1, c1, a2, b2, c2, a3, b3, c3]}}, required: [move]}"
SELF_PLAY = """
name: tiny_ttt
protocol: {type: tictactoe, players: [x, o], opponent: o}
roles:  # squares as an enum: the first move is always legal, so O gets to play
  - {use: game_player, name: x, policy: {adapter: player, sampling: {max_tokens: 8}}, max_retries: 0, output_schema: SQUARES}
  - {use: game_player, name: o, policy: {adapter: player, sampling: {max_tokens: 8}}, max_retries: 0, output_schema: SQUARES}
tasks: [{}]
model: tiny
training:
  trainer: self-play
  trainer_config: {players: [x, o], snapshot_every: 5, pool_size: 2}
  steps: 1
  group_size: 2
  groups_per_step: 1
  eval_every: 0
  eval_episodes: 4
  eval_opponent: random
""".replace("SQUARES", SQUARES)


def test_evaluations_play_the_configured_opponent(tmp_path):
    run = tmp_path / "run"
    proc = train(str(write(tmp_path / "ttt.yaml", SELF_PLAY)), "--out", str(run))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    evals = [r for r in rows(run) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 1]
    assert all(0.0 <= r["eval_win_rate/x"] <= 1.0 for r in evals)

    def o_attempts(folder: str) -> list[dict]:
        lines = (run / folder / "transcripts.jsonl").read_text().splitlines()
        return [a for line in lines for t in json.loads(line)["turns"] if t["role"] == "o" for a in t["attempts"]]

    assert o_attempts("evals/step-000000") and not any(a["token_ids"] for a in o_attempts("evals/step-000000"))  # random
    assert o_attempts("rollouts/step-000001") and all(a["token_ids"] for a in o_attempts("rollouts/step-000001"))  # the model


def test_a_bad_eval_opponent_is_one_line(tmp_path, cli):
    recipe = write(tmp_path / "ttt.yaml", SELF_PLAY.replace("eval_opponent: random", "eval_opponent: nobody"))
    proc = train(str(recipe), "--out", str(tmp_path / "run"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "nobody" in err and "Traceback" not in err
    code, _, err = cli("validate", recipe)  # caught when the recipe loads, named by file and key
    assert code == 2 and f"{recipe}:" in err and "training.eval_opponent: unknown opponent 'nobody'" in err


def test_a_checkpoint_eval_opponent_that_does_not_load_is_one_line(tmp_path, cli):
    """eval_opponent: checkpoint:DIR with an adapter_config.json and no weights beside it passed the
    recipe's check, then was a ValueError traceback as training loaded it."""
    (tmp_path / "opponent").mkdir()
    (tmp_path / "opponent" / "adapter_config.json").write_text('{"r": 8}')
    recipe = write(tmp_path / "ttt.yaml", SELF_PLAY.replace("eval_opponent: random",
                                                             f"eval_opponent: checkpoint:{tmp_path / 'opponent'}"))
    code, _, err = cli("train", recipe, "--out", tmp_path / "run", "--no-progress")
    assert code == 2 and "Traceback" not in err, err
    assert f"training.eval_opponent checkpoint:{tmp_path / 'opponent'}: no adapter_model.safetensors (or .bin) in" in err


def test_a_checkpoint_eval_opponent_beside_a_learner_of_its_adapter_name_is_one_line(tmp_path, cli):
    """A learner playing adapter eval-opponent: its weights, published under that name, replaced the
    checkpoint in the engine, and every evaluation played the learner against itself, unsaid."""
    from support import lora_state, peft_dir

    folder = peft_dir(tmp_path / "opponent", lora_state(tiny_engine().model, 3))
    recipe = write(tmp_path / "ttt.yaml", SELF_PLAY.replace("adapter: player", "adapter: eval-opponent")
                   .replace("eval_opponent: random", f"eval_opponent: checkpoint:{folder}"))
    code, _, err = cli("validate", recipe)
    assert code == 2 and "Traceback" not in err, err
    assert ("training.eval_opponent: role 'x' plays adapter 'eval-opponent', the name a checkpoint opponent is "
            "loaded under: give that adapter another name") in err


def test_an_eval_opponent_checkpoint_the_engine_refuses_is_one_line(tmp_path, cli):
    """checkpoint:PATH to another base model's adapter (or one without its weights) was the
    engine's ValueError as a traceback, once the model had loaded."""
    from support import lora_state, peft_dir

    state = lora_state(tiny_engine().model, 3)
    key = next(k for k in state if k.endswith("lora_A.weight"))
    state[key] = torch.zeros(state[key].shape[0], state[key].shape[1] * 2)  # a wider model's layer
    folder = peft_dir(tmp_path / "other", state)
    recipe = write(tmp_path / "ttt.yaml", SELF_PLAY.replace("eval_opponent: random", f"eval_opponent: checkpoint:{folder}"))
    code, _, err = cli("train", recipe, "--out", tmp_path / "run", "--no-progress")
    assert code == 2
    assert f"training.eval_opponent checkpoint:{folder}: adapter 'eval-opponent' does not fit this model" in err


def test_resume_continues_the_run_as_it_was_started(cli, tmp_path):
    from support import SMALL_TRAINING, train_tiny

    root = Path(__file__).resolve().parents[2]
    recipe, run = root / "recipes/guess_number.yaml", tmp_path / "run"  # the recipe's own model is smollm2-135m
    train_tiny(cli, recipe, run, 1, "--set", "checkpoint_every=1")
    same = ["--out", run, "--resume", "--no-progress", "--dtype", "float32", *SMALL_TRAINING, "--set", "checkpoint_every=1"]
    for extra, message in (
        (["--model", "smollm2-135m"], "was started with --model tiny; this command gives smollm2-135m"),
        (["--seed", "7"], "was started with --seed 0"),
        (["--set", "group_size=4"], "was started with training.group_size = 2, this command has 4"),
    ):
        code, _, err = cli("train", recipe, *same, *extra)
        assert code == 2 and message in err and "Traceback" not in err, err
    code, _, err = cli("train", root / "recipes/rps.yaml", *same)
    assert code == 2 and "is a run of recipe 'guess_number', not 'rps'" in err, err
    from orchestrator.api import as_started, load_team
    from orchestrator.cli.flags import parse_sets
    from orchestrator.launch import Compute

    team = load_team(recipe, parse_sets([*SMALL_TRAINING[1::2], "checkpoint_every=1"]))
    compute, seed, steps = as_started(team, run, Compute(), None, None)  # no --dtype: auto, bf16 where the CPU has it
    assert (compute.model, compute.dtype, seed, steps) == ("tiny", "float32", 0, 1)
    assert [r["step"] for r in rows(run) if r["kind"] == "train"] == [1]  # nothing written by the refusals
    code, _, err = cli("train", recipe, *same, "--steps", "2")  # no --model: the run's, tiny
    assert code == 0, err
    assert [r["step"] for r in rows(run) if r["kind"] == "train"] == [1, 2]
    # the run now goes to step 2: resumed again without --steps it had finished, not gone past its steps
    before = (run / "metrics.jsonl").read_text()
    code, _, err = cli("train", recipe, *same)
    assert code == 0, err
    assert (run / "metrics.jsonl").read_text() == before
    code, _, err = cli("train", recipe, *same, "--set", "steps=3")  # as --steps 3, not passed over for the run's 2
    assert code == 0, err
    assert [r["step"] for r in rows(run) if r["kind"] == "train"] == [1, 2, 3]


def test_a_resumed_runs_progress_bar_starts_at_the_steps_it_has_done(cli, tmp_path, monkeypatch):
    """Resumed from step 1's checkpoint with --steps 2, the bar began at 2 of 2 (100%), a step
    it had still to train."""
    from rich.progress import Progress

    from support import SMALL_TRAINING, train_tiny

    recipe, run = Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml", tmp_path / "run"
    train_tiny(cli, recipe, run, 1, "--set", "checkpoint_every=1")
    begun, add_task = [], Progress.add_task
    monkeypatch.setattr(Progress, "add_task",
                        lambda self, what, **kw: begun.append((what, kw.get("completed", 0))) or add_task(self, what, **kw))
    code, _, err = cli("train", recipe, "--out", run, "--resume", "--steps", "2", "--dtype", "float32", *SMALL_TRAINING,
                       "--set", "checkpoint_every=1")
    assert code == 0, err
    assert ("run steps", 1) in begun  # the run's name: compare's strategies were all "training"


def test_a_training_runs_rollouts_and_evaluations_count_their_episodes_beneath_its_bar(cli, tmp_path, monkeypatch):
    """Rollouts and evaluations ran with no bar at all: an evaluation of 64 episodes passed in
    silence, the steps' bar standing still. Each now counts on a line of the run's bar, removed
    when it ends."""
    from rich.progress import Progress

    from support import SMALL_TRAINING

    recipe, run = Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml", tmp_path / "run"
    lines, removed = {}, []  # (task, bar) -> (description, total); descriptions of the removed
    add_task, remove_task = Progress.add_task, Progress.remove_task

    def added(bar, what, **kw):
        task = add_task(bar, what, **kw)
        lines[task, id(bar)] = what, kw["total"]
        return task

    monkeypatch.setattr(Progress, "add_task", added)
    monkeypatch.setattr(Progress, "remove_task",
                        lambda self, task: removed.append(lines[task, id(self)][0]) or remove_task(self, task))
    code, _, err = cli("train", recipe, "--model", "tiny", "--steps", "2", "--out", run, "--dtype", "float32",
                       *SMALL_TRAINING, "--set", "eval_every=1")
    assert code == 0, err
    assert len({bar for _, bar in lines}) == 1, lines  # one live display: a second console's would fight the first
    assert sorted(lines.values()) == [("evals/step-000000 episodes", 2), ("evals/step-000001 episodes", 2),
                                      ("evals/step-000002 episodes", 2), ("rollouts/step-000001 episodes", 2),
                                      ("rollouts/step-000002 episodes", 2), ("run steps", 2)]
    assert sorted(removed) == sorted(what for what, _ in lines.values() if what != "run steps")


def test_resume_refuses_a_recipe_edited_since_the_run_started(tmp_path):
    """Only the training block was compared: a recipe whose protocol, roles or tasks changed resumed
    without a word, its config.yaml still recording the recipe as it was."""
    import yaml

    from orchestrator.api import as_started, load_team
    from orchestrator.errors import RolecastError
    from orchestrator.launch import Compute

    root = Path(__file__).resolve().parents[2]
    team = load_team(root / "recipes/guess_number.yaml")
    run = write(tmp_path / "run" / "config.yaml", yaml.safe_dump(
        {"recipe": team.resolved(), "run": {"seed": 0, "model": "tiny", "steps": 1}})).parent
    text = (root / "recipes/guess_number.yaml").read_text()
    for old, new, words in (("turns: 5", "turns: 2", "protocol.turns = 5, this command has 2"),
                            ("name: guesser\n", "name: guesser\n    policy: {adapter: other}\n",
                             "roles[0].policy.adapter = 'guesser', this command has 'other'"),
                            ("{secret: 16}]", "{secret: 16}, {secret: 3}]", "tasks = [{'secret': 1}, "),
                            # a protocol key deleted: its default (consistent) is not what the run had
                            ("  process: halving ", "  # process: halving ", "protocol.process = 'halving', this command has 'consistent'"),
                            # a task key deleted (the env then draws the secret): compared key by key
                            ("{secret: 16}]", "{}]", "tasks[11].secret = 16, this command has (not set)")):
        edited = write(tmp_path / "recipes" / "guess_number.yaml", text.replace(old, new))
        with pytest.raises(RolecastError, match="was started with " + re.escape(words)):
            as_started(load_team(edited), run, Compute(), None, None)
    shutil.copytree(root / "roles", tmp_path / "roles")  # as a checkout moved elsewhere: its templates' paths differ
    moved = write(tmp_path / "recipes" / "guess_number.yaml", text.replace("use: number_guesser",
                                                                          f"use: {tmp_path}/roles/number_guesser.yaml"))
    assert as_started(load_team(moved), run, Compute(), None, None)[1:] == (0, 1)


def test_resume_refuses_an_eval_tasks_file_edited_since_the_run_started(tmp_path):
    """config.yaml recorded training.eval_tasks as the file's path: a file edited since resumed
    without a word, the run's later evaluations on other tasks than its first."""
    import yaml

    from orchestrator.api import as_started, load_team
    from orchestrator.errors import RolecastError
    from orchestrator.launch import Compute

    root = Path(__file__).resolve().parents[2]
    text = (root / "recipes/guess_number.yaml").read_text().replace("use: number_guesser", f"use: {root}/roles/number_guesser.yaml")
    recipe = write(tmp_path / "recipes" / "guess_number.yaml", re.sub(r"eval_tasks: \[.*\]", "eval_tasks: held.yaml", text))
    held = write(tmp_path / "recipes" / "held.yaml", "[{secret: 3}, {secret: 6}]\n")
    started = load_team(recipe).resolved()
    run = write(tmp_path / "run" / "config.yaml", yaml.safe_dump({"recipe": started, "run": {"seed": 0, "model": "tiny", "steps": 1}})).parent
    held.write_text("[{secret: 3}, {secret: 9}]\n")
    with pytest.raises(RolecastError, match=re.escape("training.eval_tasks[1].secret = 6, this command has 9")):
        as_started(load_team(recipe), run, Compute(), None, None)
    # a run an older rolecast started recorded the path only: what the file held then is not known
    write(run / "config.yaml", yaml.safe_dump({"recipe": {**started, "training": {**started["training"], "eval_tasks": "held.yaml"}},
                                               "run": {"seed": 0, "model": "tiny", "steps": 1}}))
    assert as_started(load_team(recipe), run, Compute(), None, None)[1:] == (0, 1)


def test_resume_refuses_a_plugin_option_set_then_and_left_off_now(tmp_path):
    """A plugin's options (trainer_config, loss_config, ...) are recorded as written: a key there
    that one side lacked was passed over, so a run started with --set loss_config.entropy_coef=0.1
    resumed without it (or with one it never had) without a word and trained another loss."""
    import yaml

    from orchestrator.api import as_started, load_team
    from orchestrator.errors import RolecastError
    from orchestrator.launch import Compute

    recipe = Path(__file__).resolve().parents[2] / "recipes/rps_population.yaml"
    for then, now, words in (({"loss_config.entropy_coef": 0.1}, {}, "training.loss_config.entropy_coef = 0.1, "
                                                                     "this command has (not set)"),
                             ({}, {"trainer_config.elo_k": 32.0}, "training.trainer_config.elo_k = (not set), "
                                                                  "this command has 32.0")):
        run = write(tmp_path / "run" / "config.yaml", yaml.safe_dump(
            {"recipe": load_team(recipe, then).resolved(), "run": {"seed": 0, "model": "tiny", "steps": 1}})).parent
        with pytest.raises(RolecastError, match="was started with " + re.escape(words)):
            as_started(load_team(recipe, now), run, Compute(), None, None)
    assert as_started(load_team(recipe, then), run, Compute(), None, None)[1:] == (0, 1)


def test_a_resumed_run_with_lora_dropout_trains_the_weights_of_one_run_straight(cli, tmp_path):
    """LoRA dropout draws from torch's generator, which a process seeds from the OS: a run seeds
    it from --seed, so two runs, and a run and its resumed twin, drop the same units."""
    recipe = Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml"
    flags = ["--set", "lora.dropout=0.5", "--set", "checkpoint_every=1"]
    train_tiny(cli, recipe, tmp_path / "straight", 2, *flags)
    train_tiny(cli, recipe, tmp_path / "resumed", 1, *flags)
    train_tiny(cli, recipe, tmp_path / "resumed", 2, *flags, "--resume")
    for step in ("step-000001", "step-000002"):
        straight, resumed = (load_file(str(tmp_path / run / "checkpoints" / step / "adapters" / "guesser" /
                                           "adapter_model.safetensors")) for run in ("straight", "resumed"))
        # apart by the engine's batching at most (a sampling logprob's last bits), not by a dropout mask
        assert all(torch.allclose(straight[k], resumed[k], rtol=0, atol=1e-6) for k in straight), step


def test_out_through_a_file_and_counts_below_one_are_one_line(cli, tmp_path, capsys):
    recipe = Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml"
    (tmp_path / "afile").write_text("")
    code, _, err = cli("train", recipe, "--model", "tiny", "--out", tmp_path / "afile" / "run")
    assert code == 2 and "is a file, not a folder" in err and "Traceback" not in err
    for command, flag in (("train", "--steps"), ("run", "--episodes"), ("eval", "--episodes")):
        with pytest.raises(SystemExit) as stop:  # argparse's own exit, before anything runs
            cli(command, recipe, flag, "0")
        assert stop.value.code == 2 and f"argument {flag}: must be at least 1, got 0" in capsys.readouterr().err


def test_metrics_drop_a_cut_off_last_line_and_name_a_damaged_one(tmp_path):
    from orchestrator.errors import RolecastError
    from orchestrator.training.metrics import MetricsWriter, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "kind": "eval"}\n{"step": 1, "kind": "train"}\n{"step": 2, "ki')  # killed mid-append
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]
    path.write_text('{"step": 0, "kind": "eval"}\n\n{"step": 1, "kind": "train"}\n')  # a blank line is no row
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]
    path.write_text('{"step": 0, "kind": "eval"}\n{"step": 1, "kind": "train"}\n{"step": 2, "ki')
    MetricsWriter(tmp_path).truncate_after(0)  # what --resume from step 0 does
    assert path.read_text() == '{"step": 0, "kind": "eval"}\n'
    path.unlink()  # a run killed before its first row, resumed: it starts again, with nothing to drop
    MetricsWriter(tmp_path).truncate_after(-1)
    assert not path.exists()
    path.write_text('{"step": 0, "kind": "eval"}\n{"ste\n{"step": 1, "kind": "train"}\n')
    with pytest.raises(RolecastError, match=r"metrics.jsonl:2: not a JSON row"):
        read_metrics(tmp_path)
    path.write_text('{"step": 0, "kind": "eval"}\n{"step": 1}\n')  # every reader tells train from eval rows by kind
    with pytest.raises(RolecastError, match=r"metrics.jsonl:2: not a metrics row"):
        read_metrics(tmp_path)
    path.write_text('{"step": 0, "kind": "eval"}\n{"step": true, "kind": "train"}\n')  # JSON's true is no step
    with pytest.raises(RolecastError, match=r"metrics.jsonl:2: not a metrics row"):
        read_metrics(tmp_path)


def test_a_full_disk_leaves_metrics_rows_whole_and_names_the_file(small_disk):
    """A row the disk took half of stayed as a cut-off last line, and TensorBoard's writer said ENOSPC
    naming no file: `rolecast train` ended in 'rolecast: No space left on device'."""
    from orchestrator.training.metrics import MetricsWriter, read_metrics

    writer = MetricsWriter(small_disk)
    with pytest.raises(OSError) as refused:
        for step in range(1000):
            writer.write({"step": step, "kind": "train", "note": "x" * 2000})
    assert refused.value.errno == errno.ENOSPC
    assert refused.value.filename in (str(small_disk / "metrics.jsonl"), str(small_disk / "tb"))
    assert (small_disk / "metrics.jsonl").read_bytes().endswith(b"\n")
    assert [row["step"] for row in read_metrics(small_disk)] == list(range(len(read_metrics(small_disk))))
    with contextlib.suppress(OSError):
        writer.close()


def test_a_full_disk_at_close_names_the_tensorboard_dir(tmp_path, monkeypatch):
    """TensorBoard's writer says ENOSPC naming no file when it closes too: `rolecast train` ended
    in 'rolecast: No space left on device'."""
    from torch.utils.tensorboard import SummaryWriter

    from orchestrator.training.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path)
    writer.write({"step": 1, "kind": "train", "loss": 1.0})

    def full(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SummaryWriter, "close", full)
    with pytest.raises(OSError) as refused:
        writer.close()
    assert refused.value.errno == errno.ENOSPC and refused.value.filename == str(tmp_path / "tb")


def test_the_error_that_stopped_a_run_is_not_replaced_by_its_metrics_writer_closing(tmp_path):
    """The writer was closed in a ``finally``: its close failing too (TensorBoard's flush on the
    same full disk) replaced the run's own error, here a trainer plugin's, which the user never saw."""
    from types import SimpleNamespace

    from orchestrator.errors import RunFailed
    from orchestrator.training.loop import TrainingRun

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "tb"))

    async def fails() -> None:
        raise RunFailed("trainer plugin 'mine': loss raised ValueError")

    run = SimpleNamespace(_run=fails, metrics=SimpleNamespace(close=full))
    with pytest.raises(RunFailed, match="trainer plugin 'mine'"):
        asyncio.run(TrainingRun.run(run))
    run._run = lambda: asyncio.sleep(0, {"steps": 1})  # a run that ended well says its writer's fault
    with pytest.raises(OSError, match="No space left"):
        asyncio.run(TrainingRun.run(run))


def test_a_full_disk_writing_trainer_json_is_not_the_trainers_fault(tmp_path, monkeypatch):
    """The write was inside the block that blames the trainer plugin's state_dict for what fails:
    "trainer plugin 'grpo': state_dict raised OSError ...; fix the plugin"."""
    import builtins
    from types import SimpleNamespace

    from orchestrator.training.loop import TrainingRun

    real = builtins.open

    def full(file, mode="r", *args, **kwargs):
        if str(file).endswith("trainer.json.tmp") and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)
    run = SimpleNamespace(_write_samplers=lambda: None, run_dir=tmp_path, clients={}, published={},
                          cfg=SimpleNamespace(trainer="grpo", keep_checkpoints=2), trainer=SimpleNamespace(state_dict=dict))
    with pytest.raises(OSError) as refused:
        TrainingRun.checkpoint(run, 1)
    assert refused.value.filename.endswith("trainer.json") and "plugin" not in str(refused.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []


def test_a_json_file_written_atomically_keeps_what_it_held_when_the_write_fails(tmp_path):
    """summary.json, eval.json, compare.json and population.json are written so: a write cut short
    (here a text the encoder refuses half way; a kill alike) had left an empty or half file."""
    from orchestrator.files import write_atomic

    path = tmp_path / "summary.json"
    write_atomic(path, '{"ok": 1}')
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, '{"text": "' + "x" * 100_000 + '\ud800"}')
    assert path.read_text() == '{"ok": 1}'


def test_tensorboard_shows_the_redone_steps_once_after_a_resume(tmp_path, monkeypatch):
    """The stopped run's events of the steps after the checkpoint stay in its event file; the
    resumed run's writer purges them from TensorBoard's display, as truncate_after drops the rows."""
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from orchestrator.training.metrics import MetricsWriter

    # Event files are read in name order: start time, then a per-process counter that sorts as text
    # (".10" before ".9"). A resumed run starts in a later process; here, in this one, the stopped
    # run's file is dated a minute back so, as there, it is read first.
    with monkeypatch.context() as earlier:
        earlier.setattr(time, "time", lambda now=time.time(): now - 60)
        stopped = MetricsWriter(tmp_path)
        for step in (1, 2, 3):
            stopped.write({"step": step, "kind": "train", "loss": float(step)})  # killed after step 3: never closed
    resumed = MetricsWriter(tmp_path)
    resumed.truncate_after(1)  # the checkpoint was step 1's
    for step in (2, 3):
        resumed.write({"step": step, "kind": "train", "loss": 10.0 + step})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0), (2, 12.0), (3, 13.0)]


def test_tensorboard_keeps_an_evaluations_counts_apart_from_the_steps(tmp_path):
    """An eval row's ``episodes`` and ``engine/...`` went to the train row's tags at the same step:
    one curve held both the step's rollouts and the evaluation's, point by point."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from orchestrator.training.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path)
    writer.write({"step": 1, "kind": "train", "episodes": 32, "engine/decode_s": 2.0})
    writer.write({"step": 1, "kind": "eval", "episodes": 64, "engine/decode_s": 5.0, "eval_reward/guesser": 0.5})
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {"episodes": [(1, 32.0)], "engine/decode_s": [(1, 2.0)], "eval_episodes": [(1, 64.0)],
                       "eval_engine/decode_s": [(1, 5.0)], "eval_reward/guesser": [(1, 0.5)]}


@pytest.fixture
def breaking_env():
    """``breaking_guess``, in the CLI's registry: Guess the Number whose step raises in a share
    ``breaks`` of the episodes of a task (a fault in the env, not a result of the guesser's)."""
    from orchestrator.envs.guess_number import GuessNumberEnv
    from orchestrator.registry import default_registry
    from support import plugin

    class Breaking(GuessNumberEnv):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.breaks = self.rng.random() < self.task.get("breaks", 0.0)

        async def step(self, role, message):
            if self.breaks and len(self.history) >= self.task.get("after", 0):  # after that many guesses
                raise RuntimeError("the env broke")
            return await super().step(role, message)

    default_registry.cache_clear()
    default_registry().add_module(plugin(register_envs=lambda register: register("breaking_guess", Breaking)), "breaking", "test")
    yield
    default_registry.cache_clear()


def breaking_recipe(tmp_path: Path, tasks: str) -> Path:
    text = (Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml").read_text()
    start, end = text.index("tasks: [{secret: 1}"), text.index("training:")
    return write(tmp_path / "guess.yaml", text[:start].replace("type: guess_number", "type: breaking_guess") + f"tasks: {tasks}\n" + text[end:])


def test_a_step_where_every_episode_failed_stops_the_run(breaking_env, cli, tmp_path):
    from support import SMALL_TRAINING

    def writers() -> int:  # TensorBoard's, each with its event file open
        return sum(type(t).__name__ == "_AsyncWriterThread" for t in threading.enumerate())

    run, before = tmp_path / "run", writers()
    recipe = breaking_recipe(tmp_path, "[{secret: 1, breaks: 1.0}, {secret: 2, breaks: 1.0}]")  # the eval tasks do not break
    code, _, err = cli("train", recipe, "--model", "tiny", "--steps", "2", "--out", run, "--no-progress", "--dtype", "float32", *SMALL_TRAINING)
    assert code == 1 and "Traceback" not in err, err
    assert "step 1: every episode failed, leaving nothing to train on; the first: RuntimeError: the env broke" in err
    assert [r["kind"] for r in rows(run)] == ["eval"]  # step 1 wrote no row and trained nothing
    assert writers() == before  # the failed run closed its metrics' writer


def test_episodes_that_errored_are_counted_and_not_trained_on(breaking_env, cli, tmp_path):
    from support import train_tiny

    run = tmp_path / "run"
    tasks = "[{secret: 1, breaks: 0.5, after: 1}, {secret: 2, breaks: 0.5, after: 1}]"  # a scored guess, then a fault
    recipe = breaking_recipe(tmp_path, tasks)
    recipe.write_text(recipe.read_text().replace("eval_tasks: [{secret: 3}", "eval_tasks: [{secret: 3, breaks: 1.0}"))
    train_tiny(cli, recipe, run, 1, "--set", "groups_per_step=4", "--set", "eval_episodes=8")
    # evaluations count theirs as steps do (they said `episodes: 8` whatever failed)
    for e in [r for r in rows(run) if r["kind"] == "eval"]:
        statuses = [json.loads(line)["status"] for line in
                    (run / f"evals/step-{e['step']:06d}/transcripts.jsonl").read_text().splitlines()]
        assert (e["episodes"], e["episodes_errored"], e["episodes_timed_out"]) == (8, statuses.count("error"), 0)
        assert statuses.count("error")
    code, out, err = cli("report", run)
    assert code == 0 and "Evaluation episodes that errored or timed out, in no eval reward: 2 of 8 at step 0, " \
                         "2 of 8 at step 1." in out, (out, err)
    (row,) = [r for r in rows(run) if r["kind"] == "train"]
    lines = (run / "rollouts/step-000001/transcripts.jsonl").read_text().splitlines()
    errored = [json.loads(line) for line in lines if json.loads(line)["status"] == "error"]
    assert row["episodes"] == 8 and row["episodes_errored"] == len(errored) and 0 < len(errored) < 8
    assert all(ep["turns"] and ep["turns"][0]["attempts"][0]["token_ids"] for ep in errored)  # sampled, then broke
    assert all(ep["turns"][0]["score"] is not None for ep in errored)
    # the turn measures describe the episodes that ran, as the rollout's summary.json does
    ran = [t for ep in map(json.loads, lines) if ep["status"] != "error" for t in ep["turns"]]
    assert row["turn_score/guesser"] == pytest.approx(sum(t["score"] for t in ran) / len(ran))
    summary = json.loads((run / "rollouts/step-000001/summary.json").read_text())
    assert row["valid_turn_rate"] == pytest.approx(summary["valid_turn_rate"]) and summary["turns"] == len(ran)
    # an episode of Guess the Number is one datum (its turns continue each other): only the others'
    assert row["guesser/datums"] == 8 - len(errored)
    # nor are they in a baseline: each group's finished episodes are centred among themselves
    failed = {ep["id"] for ep in errored}
    credit = [json.loads(line) for line in (run / "rollouts/step-000001/credit.jsonl").read_text().splitlines()]
    for c in credit:
        assert (c["advantages"]["guesser"], c["trained"]) == (0.0, []) if c["episode"] in failed else c["trained"] == ["guesser"]
    for g in {c["group"] for c in credit}:
        assert abs(sum(c["advantages"]["guesser"] for c in credit if c["group"] == g and c["episode"] not in failed)) < 1e-9
    finished = [c["rewards"]["guesser"] for c in credit if c["episode"] not in failed]
    assert row["reward/guesser"] == pytest.approx(sum(finished) / len(finished))


def test_a_reward_plugin_is_not_asked_about_an_episode_that_failed(breaking_env, cli, tmp_path):
    """A failed episode has no outcome (its env broke before giving one): a reward that reads the
    process reward raised KeyError on it, and stopped a run whose other episodes trained as ever."""
    from orchestrator.registry import default_registry
    from support import plugin, train_tiny

    def process_reward(episode, roles, config):
        return {role: episode.outcome["process"][role] for role in roles}

    default_registry().add_module(plugin(register_rewards=lambda register: register("process", process_reward)), "process", "test")
    run = tmp_path / "run"
    recipe = breaking_recipe(tmp_path, "[{secret: 1, breaks: 0.5, after: 1}, {secret: 2, breaks: 0.5, after: 1}]")
    recipe.write_text(recipe.read_text().replace("reward: hybrid", "reward: process").replace("reward_config: {alpha: 0.6}", ""))
    train_tiny(cli, recipe, run, 1, "--set", "groups_per_step=4")
    episodes = {ep["id"]: ep for ep in map(json.loads, (run / "rollouts/step-000001/transcripts.jsonl").read_text().splitlines())}
    credit = [json.loads(line) for line in (run / "rollouts/step-000001/credit.jsonl").read_text().splitlines()]
    assert 0 < sum(episodes[c["episode"]]["status"] == "error" for c in credit) < 8
    for c in credit:  # a failed episode keeps the env's placeholder, in no baseline
        ep = episodes[c["episode"]]
        assert c["rewards"] == (ep["rewards"] if ep["status"] == "error" else ep["outcome"]["process"])


def test_an_evaluations_trained_reward_leaves_out_the_episodes_that_failed(tmp_path, monkeypatch):
    """eval_trained_reward/ is over the evaluation's finished episodes, as eval_reward/ is: a failed
    one's placeholder rewards (zeros) pulled it towards 0."""
    import asyncio
    from types import SimpleNamespace

    from orchestrator.registry import config_model, default_registry
    from orchestrator.rollout import RunResult, summarize
    from orchestrator.team import load_team
    from orchestrator.training import loop
    from orchestrator.training.metrics import MetricsWriter
    from support import make_episode

    team = load_team(Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml")  # reward: hybrid, alpha 0.6
    episodes = [make_episode(rewards={"guesser": r}, outcome={"process": {"guesser": p}}) for r, p in ((1.0, 0.5), (0.0, 0.25), (0.0, 0.0))]
    episodes[2].status = "error"

    async def played(team, policies, options):
        return RunResult(tmp_path, summarize(team, episodes, 1.0), episodes)

    monkeypatch.setattr(loop, "run_team", played)
    run = loop.TrainingRun.__new__(loop.TrainingRun)
    run.team = run.eval_team = team
    run.cfg, run.options, run.run_dir, run.metrics = team.config.training, SimpleNamespace(seed=0), tmp_path, MetricsWriter(tmp_path)
    run.eval_policies, run.eval_opponent_role, run.play_eval, run.concurrency, run.engine, run.rollouts, run.bar = \
        {}, None, None, 1, SimpleNamespace(versions={}), None, None
    run.trainer, run.clients = SimpleNamespace(eval_adapters_for=lambda i: {}), {}
    run.reward_fn = default_registry().get("rewards", "hybrid")
    run.reward_config = config_model(run.reward_fn).model_validate(run.cfg.reward_config)
    row = asyncio.run(run.evaluate(0))
    run.metrics.close()
    assert row["eval_reward/guesser"] == 0.5  # the env's, over the two that finished
    assert row["eval_trained_reward/guesser"] == pytest.approx((0.6 + 0.4 * 0.5 + 0.4 * 0.25) / 2)


def test_a_rollouts_opponents_are_chosen_as_it_starts(tmp_path, monkeypatch):
    """Episodes took their adapters as each started: with max_staleness, the last step's after_step
    (a new snapshot, new ratings) lands while the next step plays, and picked opponents by timing."""
    import asyncio
    from types import SimpleNamespace

    from orchestrator.rollout import RunResult
    from orchestrator.team import load_team
    from orchestrator.training import loop

    team = load_team(Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml")
    pool = ["live"]
    trainer = SimpleNamespace(adapters_for=lambda step, i: {"guesser": pool[-1]})

    async def played(team, policies, options):
        pool.append("snapshot@1")  # after_step of the step before, while this one plays
        return RunResult(tmp_path, {}, [options.adapters_for(i) for i in range(options.episodes)])

    monkeypatch.setattr(loop, "run_team", played)
    run = loop.TrainingRun.__new__(loop.TrainingRun)
    run.team, run.cfg, run.options, run.run_dir = team, team.config.training, SimpleNamespace(seed=0), tmp_path
    run.policies, run.concurrency, run.play, run.trainer, run.bar = {}, 1, None, trainer, None
    run.clients, run.engine = {"live": None}, SimpleNamespace(versions={"snapshot@1": 1})  # the adapters it may seat
    groups = asyncio.run(run.rollout(2))
    assert [a for g in groups for a in g] == [{"guesser": "live"}] * (run.cfg.groups_per_step * run.cfg.group_size)


def test_each_steps_rollout_draws_its_own_tasks_and_seed_and_a_group_shares_one_task(tmp_path, monkeypatch):
    """A step's groups are tasks drawn for that step (a group of group_size episodes each), its
    episodes seeded by the step: drawn again for the same step, as a resumed run does, the same."""
    import asyncio
    from types import SimpleNamespace

    from orchestrator.rollout import RunResult
    from orchestrator.team import load_team
    from orchestrator.training import loop

    team = load_team(Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml")
    played: list[tuple[int, list]] = []

    async def play(team, policies, options):
        played.append((options.seed, [t["secret"] for t in team.tasks]))
        return RunResult(tmp_path, {}, [None] * options.episodes)

    monkeypatch.setattr(loop, "run_team", play)
    run = loop.TrainingRun.__new__(loop.TrainingRun)
    run.team, run.cfg, run.options, run.run_dir = team, team.config.training, SimpleNamespace(seed=0), tmp_path
    run.policies, run.concurrency, run.play, run.bar, run.clients = {}, 1, None, None, {}
    run.engine = SimpleNamespace(versions={})
    run.trainer = SimpleNamespace(adapters_for=lambda step, i: {})
    for step in (1, 2, 3, 1):
        asyncio.run(run.rollout(step))
    size, groups = run.cfg.group_size, run.cfg.groups_per_step
    for _, secrets in played:
        assert len(secrets) == size * groups and all(len(set(secrets[g * size:(g + 1) * size])) == 1 for g in range(groups))
    assert played[3] == played[0]  # the step's own draw
    assert len({seed for seed, _ in played[:3]}) == 3 and len({tuple(secrets) for _, secrets in played[:3]}) == 3


def test_resume_edges(cli, tmp_path):
    """A finished run resumes to its final row, adding none; one stopped before its first
    checkpoint starts again from step 0; --steps below the checkpoint's step, a folder that
    holds no run and a damaged config.yaml are one line each."""
    from support import SMALL_TRAINING, train_tiny

    recipe, run = Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml", tmp_path / "run"
    train_tiny(cli, recipe, run, 2)
    before = (run / "metrics.jsonl").read_text()
    same = ["--out", run, "--resume", "--no-progress", "--dtype", "float32", *SMALL_TRAINING]
    code, out, err = cli("train", recipe, *same)
    assert code == 0, err
    assert (run / "metrics.jsonl").read_text() == before  # no second final evaluation
    assert json.loads(out.splitlines()[0]) == rows(run)[-1] and rows(run)[-1]["kind"] == "eval"

    code, _, err = cli("train", recipe, *same, "--steps", "1")
    assert code == 2 and "is at step 2, past --steps 1" in err, err

    shutil.rmtree(run / "checkpoints")  # as if killed before its first checkpoint
    code, _, err = cli("train", recipe, *same)
    assert code == 0, err
    assert [(r["step"], r["kind"]) for r in rows(run)] == [(0, "eval"), (1, "train"), (2, "train"), (2, "eval")]

    code, _, err = cli("train", recipe, "--out", tmp_path / "empty", "--resume", "--model", "tiny")
    assert code == 2 and "holds no training run (no config.yaml)" in err, err
    assert not (tmp_path / "empty").exists()  # refused before anything made it

    write(tmp_path / "played" / "config.yaml", "team: {}\n")  # as `rolecast run` leaves it: not overwritten
    code, _, err = cli("train", recipe, "--out", tmp_path / "played", "--model", "tiny")
    assert code == 2 and err.strip().endswith("already holds a run (its config.yaml): give another --out"), err
    assert (tmp_path / "played" / "config.yaml").read_text() == "team: {}\n"
    # a training run killed before its first row (no metrics yet): --resume would start it again
    write(tmp_path / "killed" / "config.yaml", "recipe: {}\nrun: {seed: 0}\n")
    code, _, err = cli("train", recipe, "--out", tmp_path / "killed", "--model", "tiny")
    assert code == 2 and "give another --out, or add --resume: it stopped before its first step" in err, err
    played = write(tmp_path / "ran" / "config.yaml", "team: {name: guess_number}\nrun: {episodes: 2, model: tiny}\n")
    code, _, err = cli("train", recipe, "--out", tmp_path / "ran", "--resume", "--no-progress", "--dtype", "float32",
                       *SMALL_TRAINING, "--steps", "1")  # as `rolecast run` leaves it: nothing to resume, kept
    assert code == 2 and "holds no training run (its config.yaml is a played run's)" in err, err
    assert played.read_text() == "team: {name: guess_number}\nrun: {episodes: 2, model: tiny}\n"
    assert sorted(p.name for p in (tmp_path / "ran").iterdir()) == ["config.yaml"]

    for name, text, words in (("unparsable", "recipe: [unclosed\n", "is unreadable (ParserError)"),
                              ("list", "- a\n- b\n", "is not a run's config"),
                              ("binary", "\udcff", "is unreadable (UnicodeDecodeError)")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_bytes(text.encode("utf-8", "surrogateescape"))
        code, _, err = cli("train", recipe, "--out", tmp_path / name, "--resume", "--model", "tiny")
        assert code == 2 and words in err and "Traceback" not in err, (name, err)


def test_a_checkpoint_from_before_trainer_json_kept_the_versions_resumes_them_from_the_rows(cli, tmp_path):
    """A checkpoint an older rolecast wrote (trainer.json without "published") resumed with its
    versions starting again: step 2 published version 2, which step 1 had, and its transcripts
    named step 1's weights. The run's rows recorded each version published."""
    from support import SMALL_TRAINING, train_tiny

    recipe, run = Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml", tmp_path / "run"
    train_tiny(cli, recipe, run, 1, "--set", "checkpoint_every=1")
    saved = run / "checkpoints" / "step-000001" / "trainer.json"
    saved.write_text(json.dumps({k: v for k, v in json.loads(saved.read_text()).items() if k != "published"}))
    code, _, err = cli("train", recipe, "--out", run, "--resume", "--steps", "2", "--no-progress", "--dtype", "float32",
                       *SMALL_TRAINING, "--set", "checkpoint_every=1")
    assert code == 0, err
    assert [r["guesser/version"] for r in rows(run) if r["kind"] == "train"] == [2, 3]  # as a run straight through
    lines = (run / "rollouts" / "step-000002" / "transcripts.jsonl").read_text().splitlines()
    assert {a["adapter_version"] for line in lines for t in json.loads(line)["turns"] for a in t["attempts"]} == {2}


def test_resume_passes_over_a_damaged_checkpoint_for_the_one_before(cli, tmp_path):
    """Checkpoints are written whole; one damaged afterwards (a file deleted by hand) is passed over
    with a warning, and with none whole the resume stops in one line rather than start again."""
    from support import SMALL_TRAINING, train_tiny

    recipe, run = Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml", tmp_path / "run"
    train_tiny(cli, recipe, run, 2, "--set", "checkpoint_every=1")
    (run / "checkpoints" / "step-000002" / "trainer.json").unlink()
    (run / "checkpoints" / ".step-000003.tmp-cut" / "adapters").mkdir(parents=True)  # a save the kill cut short
    again = ["--out", run, "--resume", "--no-progress", "--dtype", "float32", *SMALL_TRAINING, "--set", "checkpoint_every=1"]
    code, _, err = cli("train", recipe, *again, "--steps", "3")
    assert code == 0, err
    assert "checkpoint damaged" in err and "step-000002: No such file or directory" in err, err
    assert [(r["step"], r["kind"]) for r in rows(run)] == [(0, "eval"), (1, "train"), (2, "train"), (3, "train"), (3, "eval")]
    assert not list((run / "checkpoints").glob(".step-*"))  # its temp dir went with the next checkpoint

    # a file of an adapter's state, too (it was a FileNotFoundError traceback once its weights had loaded),
    # and files cut short or overwritten since (an UnpicklingError or EOFError traceback, as its weights loaded)
    (run / "checkpoints" / "step-000003" / "adapters" / "guesser" / "optimizer.pt").unlink()
    cut, overwritten = run / "checkpoints/step-000002/adapters/guesser/optimizer.pt", run / "checkpoints/step-000001/rng.pt"
    cut.write_bytes(b"")
    overwritten.write_text("not a pickle")
    code, _, err = cli("train", recipe, *again, "--steps", "4")
    assert code == 2 and "--resume: no whole checkpoint in" in err, err
    assert "step-000003: no adapters/guesser/optimizer.pt" in err, err
    assert f"step-000002: {cut} is damaged (EOFError" in err and f"step-000001: {overwritten} is damaged (Unpickling" in err, err
    assert "Traceback" not in err and rows(run)[-1]["step"] == 3  # nothing dropped

    # every checkpoint deleted since (`latest` says there was one): not a restart from step 0 that drops the rows
    for folder in (run / "checkpoints").glob("step-*"):
        shutil.rmtree(folder)
    code, _, err = cli("train", recipe, *again, "--steps", "4")
    assert code == 2 and f"{run / 'checkpoints' / 'latest'} names step-000003, which is not there" in err, err
    assert rows(run)[-1]["step"] == 3


def test_a_trainer_json_overwritten_with_other_json_is_passed_over(tmp_path):
    """A trainer.json that reads but holds no step (`{}`, a list) was a KeyError or TypeError traceback."""
    from orchestrator.errors import RolecastError
    from orchestrator.training.loop import last_checkpoint

    write(tmp_path / "checkpoints" / "step-000001" / "trainer.json", '{"step": 1, "trainer": {}}')
    write(tmp_path / "checkpoints" / "step-000002" / "trainer.json", "[2]")
    write(tmp_path / "checkpoints" / "step-000003" / "trainer.json", "{}")
    assert last_checkpoint(tmp_path, "--resume")[0].name == "step-000001"
    (tmp_path / "checkpoints" / "step-000001" / "trainer.json").write_text("{}")
    with pytest.raises(RolecastError, match="step-000003: trainer.json holds no step; step-000002: trainer.json holds no"):
        last_checkpoint(tmp_path, "--resume")


def test_trainer_state_the_trainer_cannot_load_is_one_line(cli, tmp_path):
    """A trainer.json edited by hand (self-play's pool left out) was a KeyError traceback."""
    from support import SMALL_TRAINING, train_tiny

    recipe, run = Path(__file__).resolve().parents[2] / "recipes/rps.yaml", tmp_path / "run"
    train_tiny(cli, recipe, run, 1)
    saved = run / "checkpoints" / "step-000001" / "trainer.json"
    saved.write_text(json.dumps({**json.loads(saved.read_text()), "trainer": {}}))
    code, _, err = cli("train", recipe, "--out", run, "--resume", "--steps", "2", "--no-progress", "--dtype", "float32",
                       *SMALL_TRAINING)
    assert code == 1 and "Traceback" not in err, err
    assert "trainer plugin 'self-play': load_state_dict of step-000001/trainer.json raised KeyError: 'pool'" in err


def test_a_trainer_whose_opponent_adapters_fails_on_resume_is_one_line(cli, tmp_path, monkeypatch):
    """--resume asks the trainer for its snapshots before any step does: a fault there was a
    traceback, where the same hook's fault at a step is one line naming the plugin."""
    from support import SMALL_TRAINING, train_tiny

    from plugins.trainers.self_play import SelfPlay

    recipe, run = Path(__file__).resolve().parents[2] / "recipes/rps.yaml", tmp_path / "run"
    train_tiny(cli, recipe, run, 1)

    def broken(self):
        raise KeyError("pool")

    monkeypatch.setattr(SelfPlay, "opponent_adapters", broken)
    code, _, err = cli("train", recipe, "--out", run, "--resume", "--steps", "2", "--no-progress", "--dtype", "float32",
                       *SMALL_TRAINING)
    assert code == 1 and "Traceback" not in err, err
    assert "trainer plugin 'self-play': opponent_adapters raised KeyError: 'pool'" in err


def test_an_opponent_snapshot_deleted_or_damaged_since_is_one_line(cli, tmp_path):
    """The checkpoint's pool names snapshots kept in pool/: one deleted or cut short by hand was a
    FileNotFoundError or ValueError traceback as --resume loaded it into the engine."""
    from support import SMALL_TRAINING, train_tiny

    recipe, run = Path(__file__).resolve().parents[2] / "recipes/rps.yaml", tmp_path / "run"
    train_tiny(cli, recipe, run, 1, "--set", "trainer_config.snapshot_every=1")
    snapshot = run / "pool" / "player@1"
    again = ["--out", run, "--resume", "--steps", "2", "--no-progress", "--dtype", "float32", *SMALL_TRAINING,
             "--set", "trainer_config.snapshot_every=1"]
    (snapshot / "adapter_model.safetensors").write_bytes(b"")
    code, _, err = cli("train", recipe, *again)
    assert code == 2 and "Traceback" not in err, err
    assert f"--resume: opponent 'player@1' of step-000001 does not load from {snapshot}: cannot read" in err, err
    shutil.rmtree(snapshot)
    code, _, err = cli("train", recipe, *again)
    assert code == 2 and "Traceback" not in err and "No such file or directory" in err, err
    assert rows(run)[-1]["step"] == 1  # nothing dropped


def test_report_names_what_is_wrong_with_a_run_dir_in_one_line(cli, tmp_path):
    good = [{"step": 0, "kind": "eval", "eval_reward/pro": 0.5, "eval_ci95/pro": 0.1},
            {"step": 1, "kind": "train", "reward/pro": 0.25, "note": "text is not plotted"},
            {"step": 1, "kind": "eval", "eval_reward/pro": 0.75}]  # no interval: shown without one
    run = tmp_path / "run"
    write(run / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in good))
    code, out, err = cli("report", run)
    assert code == 0, err
    assert "| pro | 0.500 ± 0.100 (step 0) | 0.750 (step 1) |" in out
    plots = [str(run / "report" / name) for name in ("reward.png", "eval.png")]  # PLOTS' order; no loss, no kl
    assert out.endswith("".join(f"plot: {plot}\n" for plot in plots)), out
    code, out, err = cli("report", run, "--json")
    summary = json.loads(out)
    assert code == 0 and "| pro | 0.500 ± 0.100 (step 0) | 0.750 (step 1) |" in summary["table"], err
    assert (summary["plots"], summary["steps"], summary["steps_planned"]) == (plots, 1, None)  # no config.yaml
    assert summary["eval"] == {"pro": {"first": 0.5, "first_ci95": 0.1, "last": 0.75, "last_ci95": None,
                                       "first_step": 0, "last_step": 1}}
    for name, text, words in (
        ("list-row", '[1, 2]\n{"step": 0, "kind": "eval"}\n', "metrics.jsonl:1: not a metrics row"),
        ("no-step", '{"kind": "eval"}\n{"step": 0, "kind": "eval"}\n', "metrics.jsonl:1: not a metrics row"),
        ("empty", "", "no rows yet"),
    ):
        write(tmp_path / name / "metrics.jsonl", text)
        code, _, err = cli("report", tmp_path / name)
        assert code == 2 and words in err and "Traceback" not in err, (name, err)
    for path, words in ((tmp_path / "nope", "nope: no such folder"), (run / "metrics.jsonl", "metrics.jsonl: not a folder")):
        code, _, err = cli("report", path)
        assert code == 2 and words in err, err
    (tmp_path / "latin").mkdir()
    (tmp_path / "latin" / "metrics.jsonl").write_bytes(b'{"step": 0, "kind": "eval", "x": "\xe9"}\n')
    code, _, err = cli("report", tmp_path / "latin")
    assert code == 2 and "cannot read it" in err, err
    (run / "report").rename(tmp_path / "old-report")
    (run / "report").write_text("")
    code, _, err = cli("report", run)
    assert code == 2 and "is a file" in err, err
    write(tmp_path / "cmp" / "compare.json", "{}")
    code, _, err = cli("report", tmp_path / "cmp")
    assert code == 2 and "a comparison: report one of its strategy folders" in err, err
    (tmp_path / "other").mkdir()
    code, _, err = cli("report", tmp_path / "other")
    assert code == 2 and err.strip().endswith("other: no metrics.jsonl (is this a training run dir?)"), err


def test_reports_count_of_failed_evaluation_episodes_takes_timeouts_too_at_the_tables_steps(cli, tmp_path):
    """The table's rewards are of its first and last evaluations' finished episodes: those that
    timed out are left out of them as those that errored are, and counted with them."""
    write(tmp_path / "metrics.jsonl", "".join(json.dumps({"kind": "eval", "eval_reward/pro": 0.5, "episodes": 8, **r}) + "\n"
                                              for r in ({"step": 0, "episodes_errored": 1, "episodes_timed_out": 2},
                                                        {"step": 1, "episodes_errored": 4, "episodes_timed_out": 0},
                                                        {"step": 2, "episodes_errored": 0, "episodes_timed_out": 3})))
    code, out, err = cli("report", tmp_path)
    assert code == 0 and "in no eval reward: 3 of 8 at step 0, 3 of 8 at step 2.\n" in out, (out, err)


def test_report_writes_its_table_in_utf8_whatever_the_locale(tmp_path):
    """Under LC_ALL=C (PYTHONUTF8=0) summary.md was written in the locale's ASCII: its ± was a
    UnicodeEncodeError traceback, and no table."""
    write(tmp_path / "metrics.jsonl", json.dumps({"step": 0, "kind": "eval", "eval_reward/pro": 0.5, "eval_ci95/pro": 0.1}) + "\n")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(tmp_path)], env=env,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "| pro | 0.500 ± 0.100 (step 0) |" in (tmp_path / "report" / "summary.md").read_text(encoding="utf-8")


def test_report_labels_the_curve_of_an_adapter_named_with_a_leading_underscore(tmp_path, monkeypatch):
    """matplotlib leaves a label that begins with "_" out of the legend: adapter `_coder`'s loss
    curve was drawn, unnamed, beside `coder`'s."""
    from matplotlib.figure import Figure

    from orchestrator.training.report import write_report

    write(tmp_path / "metrics.jsonl", "".join(json.dumps({"step": s, "kind": "train", "_coder/loss": 1.0 / s,
                                                          "coder/loss": 2.0 / s}) + "\n" for s in (1, 2)))
    legends = {}
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: legends.setdefault(
        Path(path).name, [t.get_text() for t in fig.axes[0].get_legend().get_texts()]))
    write_report(tmp_path)
    assert legends["loss.png"] == ["_coder/loss", "coder/loss"]


def test_reports_plot_titles_fit_their_figures(tmp_path, monkeypatch):
    """The longer titles (reward.png's, kl.png's, win_rate.png's, env.png's) were one line wider
    than the figure: both ends were cut, "how far the policy moved" read "licy moved"."""
    from matplotlib.figure import Figure

    from orchestrator.training.report import PLOTS, write_report

    keys = ["reward/pro", "eval_reward/pro", "pro/loss", "pro/approx_kl", "win_rate/pro", "elo/pro", "eval_env/rate"]
    write(tmp_path / "metrics.jsonl", "".join(json.dumps({"step": s, "kind": "train", **dict.fromkeys(keys, 0.5)}) + "\n"
                                              for s in (1, 2)))
    overhang = {}

    def measure(fig, path, **kw):
        box = fig.axes[0].title.get_window_extent(renderer=fig.canvas.get_renderer())
        overhang[Path(path).name] = max(0.0, -box.x0, box.x1 - fig.bbox.width)

    monkeypatch.setattr(Figure, "savefig", measure)
    write_report(tmp_path)
    assert overhang == {name: 0.0 for name, _, _ in PLOTS}


def test_reports_eval_band_is_each_evaluations_own_interval(tmp_path, monkeypatch):
    """The eval curve's band around each point is that evaluation's 95% interval, whatever train
    rows lie between the evaluations."""
    from matplotlib.axes import Axes

    from orchestrator.training.report import write_report

    write(tmp_path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "kind": "eval", "eval_reward/pro": 0.5, "eval_ci95/pro": 0.1},
        {"step": 1, "kind": "train", "reward/pro": 0.2},
        {"step": 2, "kind": "eval", "eval_reward/pro": 0.7, "eval_ci95/pro": 0.2})))
    bands = []
    monkeypatch.setattr(Axes, "fill_between", lambda ax, xs, lo, hi, **kw: bands.append((list(xs), lo, hi)))
    write_report(tmp_path)
    ((xs, lo, hi),) = bands
    assert xs == [0, 2] and lo == pytest.approx([0.4, 0.5]) and hi == pytest.approx([0.6, 0.9])


def test_report_of_a_one_episode_evaluation_and_of_a_stopped_run(cli, tmp_path):
    """One evaluation episode gives no interval: it was stored as 0 and shown as "± 0.000". A
    role named ``reward_model`` lost its interval ("reward" was replaced everywhere in the key);
    a run stopped early looked finished, and one still training was said to have stopped (to be
    resumed: a second process on the live run); a run stopped before its first row got "is this a
    training run dir?"; ``report | head -1`` ended in a BrokenPipeError traceback."""
    run = tmp_path / "run"
    train_tiny(cli, recipe(tmp_path, 1), run, 1, "--set", "eval_episodes=1")
    evals = [r for r in rows(run) if r["kind"] == "eval"]
    assert evals and all(r["eval_ci95/pro"] is None for r in evals)
    code, out, err = cli("report", run)
    assert code == 0 and "| pro | " in out and "±" not in out and "stopped" not in out, (out, err)

    stopped = tmp_path / "stopped"
    write(stopped / "config.yaml", "run:\n  steps: 5\n")
    write(stopped / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "kind": "eval", "eval_reward/reward_model": 0.1, "eval_ci95/reward_model": 0.05},
        {"step": 2, "kind": "train", "reward/reward_model": 0.2})))
    code, out, err = cli("report", stopped)
    assert code == 0 and "| reward_model | 0.100 ± 0.050 (step 0) |" in out and "errored" not in out, (out, err)
    assert f"at step 2 of 5, still training or stopped; if it stopped, `rolecast train RECIPE --out {stopped} --resume`" in out
    # every step trained, the final evaluation not written yet: not finished either
    write(stopped / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "kind": "eval", "eval_reward/pro": 0.1}, {"step": 5, "kind": "train", "reward/pro": 0.2})))
    code, out, err = cli("report", stopped)
    assert code == 0 and "at step 5 of 5, still training or stopped" in out, (out, err)

    (tmp_path / "early" / "evals").mkdir(parents=True)
    code, _, err = cli("report", tmp_path / "early")
    assert code == 2 and "stopped before its first evaluation finished" in err, err

    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "report", str(stopped)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE and err == "", err


def test_report_of_a_stopped_compare_strategy_names_compare(cli, tmp_path, monkeypatch):
    """A strategy's run trained a changed recipe (its trainer, a shared adapter): the report said
    `rolecast train RECIPE --resume`, which refuses it ("no adapters/pro": a damaged checkpoint?)."""
    stopped = tmp_path / "cmp" / "shared"
    write(stopped / "config.yaml", "run:\n  steps: 5\n  strategy: shared\n")
    write(stopped / "metrics.jsonl", json.dumps({"step": 0, "kind": "eval", "eval_reward/pro": 0.1}) + "\n")
    monkeypatch.chdir(stopped)
    code, out, err = cli("report", ".")
    assert code == 0, err
    assert f"stopped, `rolecast compare RECIPE --out {tmp_path / 'cmp'} --strategy shared`" in out


@pytest.fixture
def faulty_plugins():
    """A reward plugin that pays NaN and trainers that fail a step, in the CLI's registry."""
    from orchestrator.registry import default_registry
    from plugins.trainers.grpo import GRPO
    from support import plugin

    def nan_reward(episode, roles, config):
        return {role: float("nan") for role in roles}

    class Raising(GRPO):
        def advantages(self, rewards):
            raise RuntimeError("the trainer broke")

    class NoGroups(GRPO):
        def advantages(self, rewards):
            return []

    class NoRoles(GRPO):
        def advantages(self, rewards):
            return [[{} for _ in group] for group in rewards]

    class TextMetrics(GRPO):
        def after_step(self, step, episodes, rewards, snapshot):
            import numpy as np

            return {"tensor": torch.tensor(0.5), "numpy": np.float32(0.25), "note": "hello"}

    class OwnKey(GRPO):
        def after_step(self, step, episodes, rewards, snapshot):
            return {"step_s": 0.0}  # the loop's own, and written into the row after after_step ran

    class Unseating(GRPO):  # seats step 1's rollout, not step 2's
        def adapters_for(self, step, index):
            if step > 1:
                raise RuntimeError("no seats")
            return {}

    class SeatsAGhost(GRPO):
        def adapters_for(self, step, index):
            return {"guesser": "ghost"}

    class NoneToTrain(GRPO):
        def adapters_to_train(self, step):
            raise RuntimeError("no schedule")

    class TrainsAStranger(GRPO):
        def adapters_to_train(self, step):
            return ["nope"]

    class NoEvalSeats(GRPO):
        def eval_adapters_for(self, index):
            raise RuntimeError("no eval seats")

    class NoLearners(GRPO):
        def learners(self):
            raise RuntimeError("no learners")

    class Noisy(GRPO):
        def init_noise(self, adapter):
            raise RuntimeError("no noise")

    def trainers(register):
        register("raising", Raising)
        register("no-learners", NoLearners)
        register("noisy", Noisy)
        register("unseating", Unseating)
        register("none-to-train", NoneToTrain)
        register("trains-a-stranger", TrainsAStranger)
        register("seats-a-ghost", SeatsAGhost)
        register("no-eval-seats", NoEvalSeats)
        register("no-groups", NoGroups)
        register("no-roles", NoRoles)
        register("text-metrics", TextMetrics)
        register("own-key", OwnKey)

    default_registry.cache_clear()
    default_registry().add_module(plugin(register_rewards=lambda register: register("nan", nan_reward),
                                         register_trainers=trainers), "faulty", "test")
    yield
    default_registry.cache_clear()


@pytest.mark.parametrize("old, new, words", [
    ("reward: hybrid ", "reward: nan ", "reward plugin 'nan': its reward gave role 'guesser' nan in episode 0 of group 0, "
                                        "where a finite number is needed; fix it, then --resume from the last checkpoint"),
    ("trainer: grpo", "trainer: raising", "trainer plugin 'raising': advantages raised RuntimeError: the trainer broke; fix it"),
    # advantages of another shape than the step's groups: was an IndexError traceback out of the loop
    ("trainer: grpo", "trainer: no-groups", "trainer plugin 'no-groups': advantages raised ValueError: gave [] episodes "
                                            "per group for the [2] finished ones it was given; fix it"),
    # a trainable role left out: was a KeyError traceback where its datums are built
    ("trainer: grpo", "trainer: no-roles", "trainer plugin 'no-roles': advantages gave role 'guesser' None in episode 0 "
                                           "of group 0, where a finite number is needed; fix it"),
    # the trainer's hooks that seat a step's or an evaluation's episodes: were tracebacks
    ("trainer: grpo", "trainer: none-to-train", "trainer plugin 'none-to-train': adapters_to_train raised RuntimeError: "
                                                "no schedule; fix it"),
    # an adapter it does not learn (no training client): was a KeyError traceback where the datums are built
    ("trainer: grpo", "trainer: trains-a-stranger", "trainer plugin 'trains-a-stranger': adapters_to_train gave 'nope', "
                                                    "not one of its learners (guesser); fix it"),
    ("trainer: grpo", "trainer: no-eval-seats", "trainer plugin 'no-eval-seats': eval_adapters_for raised RuntimeError: "
                                                "no eval seats; fix it"),
    # an adapter the engine does not hold: its games were the base model's, and nothing said so
    ("trainer: grpo", "trainer: seats-a-ghost", "trainer plugin 'seats-a-ghost': adapters_for seated role 'guesser' on "
                                                "'ghost' in episode 0, an adapter the run does not serve (guesser); fix it"),
    # before the first step: tracebacks too
    ("trainer: grpo", "trainer: no-learners", "trainer plugin 'no-learners': learners raised RuntimeError: no learners"),
    ("trainer: grpo", "trainer: noisy", "trainer plugin 'noisy': init_noise raised RuntimeError: no noise"),
])
def test_a_plugins_fault_in_a_step_is_one_line_and_moves_no_weight(faulty_plugins, cli, tmp_path, old, new, words):
    from support import SMALL_TRAINING

    text = (Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml").read_text()
    recipe = write(tmp_path / "guess.yaml", text.replace(old, new).replace("reward_config: {alpha: 0.6}", ""))
    run = tmp_path / "run"
    code, _, err = cli("train", recipe, "--model", "tiny", "--steps", "1", "--out", run, "--no-progress",
                       "--dtype", "float32", *SMALL_TRAINING)
    assert code == 1 and words in err and "Traceback" not in err, err
    # step 1 trained nothing (a reward plugin's NaN stops even the evaluation before it)
    assert [r["kind"] for r in rows(run)] in ([], ["eval"]) if (run / "metrics.jsonl").exists() else True
    assert not (run / "checkpoints").exists()


def test_a_trainers_fault_seating_a_rollout_started_ahead_is_one_line_at_its_step(faulty_plugins, cli, tmp_path):
    """With max_staleness, step 2's rollout starts (its adapters_for runs) while step 1 trains: its
    fault was a traceback; now step 1 ends with its row and step 2 stops the run in one line."""
    from support import SMALL_TRAINING

    text = (Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml").read_text()
    recipe = write(tmp_path / "guess.yaml", text.replace("trainer: grpo", "trainer: unseating"))
    run = tmp_path / "run"
    code, _, err = cli("train", recipe, "--model", "tiny", "--steps", "2", "--out", run, "--no-progress",
                       "--dtype", "float32", *SMALL_TRAINING, "--set", "max_staleness=1")
    assert code == 1 and "Traceback" not in err, err
    assert "trainer plugin 'unseating': adapters_for raised RuntimeError: no seats; fix it" in err
    assert [(r["kind"], r["step"]) for r in rows(run)] == [("eval", 0), ("train", 1)]


@pytest.mark.parametrize("trainer,words", [
    # the tensor and the numpy float passed as numbers: the string is named
    ("text-metrics", "trainer plugin 'text-metrics': after_step gave 'note' a str, where a number is needed; fix it"),
    # one of the loop's own keys had silently overwritten the loop's figure
    ("own-key", "trainer plugin 'own-key': after_step gave 'step_s', a key the step's row has already"),
])
def test_a_trainers_metric_that_is_no_number_or_the_loops_own_is_one_line_before_the_row(
        faulty_plugins, cli, tmp_path, trainer, words):
    """after_step's metrics went into the row as they were: a tensor failed its JSON (a TypeError
    traceback, the row lost after the weights moved), a string reached the report, and a key the
    row has replaced the loop's own figure."""
    from support import SMALL_TRAINING

    text = (Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml").read_text()
    recipe = write(tmp_path / "guess.yaml", text.replace("trainer: grpo", f"trainer: {trainer}"))
    run = tmp_path / "run"
    code, _, err = cli("train", recipe, "--model", "tiny", "--steps", "1", "--out", run, "--no-progress",
                       "--dtype", "float32", *SMALL_TRAINING)
    assert code == 1 and words in err and "Traceback" not in err, err
    assert [r["kind"] for r in rows(run)] == ["eval"]


def test_a_hooks_metrics_are_floats():
    import numpy as np

    from orchestrator.errors import RunFailed
    from orchestrator.training.plugin_faults import measured

    got = measured({"t": torch.tensor(2), "n": np.float32(0.5), "i": 3, "f": 0.25}, "trainer", "t", "after_step")
    assert got == {"t": 2.0, "n": 0.5, "i": 3.0, "f": 0.25} and all(type(v) is float for v in got.values())
    assert json.dumps(got)
    with pytest.raises(RunFailed, match="after_step gave 'v' a Tensor, where a number is needed"):
        measured({"v": torch.zeros(2)}, "trainer", "t", "after_step")


def test_a_plugins_numpy_rewards_and_advantages_are_floats():
    """A reward or trainer computing with numpy (np.float32, np.int64) was refused as 'where a finite
    number is needed' (an env's numpy reward is taken); let through, a float32 would fail credit.jsonl."""
    import numpy as np

    from orchestrator.errors import RunFailed
    from orchestrator.training.plugin_faults import checked

    got = checked([[{"a": np.float32(0.5), "b": np.int64(2)}], [{"a": 1, "b": -0.25}]], ["a", "b"], "reward", "r", "its reward")
    assert got == [[{"a": 0.5, "b": 2.0}], [{"a": 1.0, "b": -0.25}]]
    assert all(type(v) is float for g in got for row in g for v in row.values()) and json.dumps(got)
    with pytest.raises(RunFailed, match="gave role 'a' True in episode 0 of group 0, where a finite number is needed"):
        checked([[{"a": True}]], None, "reward", "r", "its reward")
    with pytest.raises(RunFailed, match="gave role 'a' np.float32\\(nan\\)"):
        checked([[{"a": np.float32("nan")}]], ["a"], "reward", "r", "its reward")


def test_a_plugins_values_of_the_wrong_shape_or_kind_are_one_line_naming_it():
    """The fast check of what the CLI tests above see through a whole run: each refusal names the
    plugin and its hook, and ends in what to do."""
    from types import MappingProxyType

    import numpy as np

    from orchestrator.errors import RolecastError, RunFailed
    from orchestrator.training.plugin_faults import blamed, checked, learning, measured

    fix = "; fix it, then --resume from the last checkpoint"
    with pytest.raises(RunFailed) as caught:
        checked([[{"a": 1.0}]], ["a"], "trainer", "t", "advantages", like=[[None, None]])
    assert str(caught.value) == "trainer plugin 't': advantages gave [1] episodes per group for the step's [2]" + fix
    with pytest.raises(RunFailed, match=r"its reward gave \[1\] for episode 0 of group 0, not a mapping of role to number"):
        checked([[[1]]], ["a"], "reward", "r", "its reward")
    # only the roles asked for are checked; the rows given are not changed, and may be read-only
    row = MappingProxyType({"a": np.float32(0.5), "note": "x"})
    assert checked([[row]], ["a"], "reward", "r", "its reward") == [[{"a": 0.5, "note": "x"}]]
    assert type(row["a"]) is np.float32
    with pytest.raises(RunFailed, match="after_step gave 'loss', a key the step's row has already"):
        measured({"loss": 0.5}, "trainer", "t", "after_step", taken={"loss": 0.1})
    with pytest.raises(RunFailed, match="after_step gave 1 a float, where a number is needed"):
        measured({1: 0.5}, "trainer", "t", "after_step")
    # one adapter's name, not a list: its letters were the adapters ("gave 'p', not one of its learners")
    assert learning(["player"], {"player"}, "t") == ["player"]
    with pytest.raises(RunFailed, match="adapters_to_train gave 'player', a string where a list of adapters goes"):
        learning("player", {"player"}, "t")
    # an after_step override that snapshots and returns nothing: was a TypeError traceback after the weights moved
    with pytest.raises(RunFailed, match=r"after_step gave None, not a mapping of metric name to number \(return \{\} for none\)"):
        measured(None, "trainer", "t", "after_step", taken={"loss": 0.1})
    with pytest.raises(RunFailed) as caught, blamed("trainer", "t", "after_step"):
        raise KeyError("x")
    assert str(caught.value) == "trainer plugin 't': after_step raised KeyError: 'x'" + fix
    with pytest.raises(RunFailed) as caught, blamed("reward", "r", "its reward"):
        raise ValueError("1 validation error for M\nx\n  Input should be a valid integer")  # pydantic's, say
    assert str(caught.value) == "reward plugin 'r': its reward raised ValueError: 1 validation error for M x Input " \
                                "should be a valid integer" + fix
    with pytest.raises(RolecastError) as caught, blamed("trainer", "t", "after_step"):
        raise RolecastError("already one line")  # the plugin's own clear error, as it is
    assert str(caught.value) == "already one line"


def test_a_checkpoints_rng_state_gives_back_the_draws_of_torch_and_python(tmp_path):
    """What a resumed run draws (LoRA dropout from torch, a plugin's draws from Python's random) is
    what the run drew after the checkpoint; one seed gives one run's draws."""
    import random

    from orchestrator.training.rng import load_rng, save_rng, seed_rng

    def draws():
        return torch.rand(4).tolist(), [random.random() for _ in range(4)]

    seed_rng(7)
    first = draws()
    save_rng(tmp_path / "rng.pt")
    after = draws()
    load_rng(tmp_path / "rng.pt")
    assert draws() == after != first
    seed_rng(7)
    assert draws() == first


def test_an_adapters_datums_are_of_the_roles_it_played_in_the_finished_episodes(monkeypatch):
    """_datums: a role's turns train the adapter that played it (the trainer's override, else the
    role's own), never a failed episode's; each keyed by its sampling temperature (greedy's 0
    trains at 1.0); attempts older than max_staleness versions behind the learner are stale."""
    from types import SimpleNamespace

    from orchestrator.config import TrainingConfig
    from orchestrator.training import loop
    from support import make_episode

    calls = []

    def recording(episode, role, advantage, options=None, turn_extra=None):
        calls.append(options.min_version)
        return [f"{episode.id}:{role}:{advantage}"]

    monkeypatch.setattr(loop, "role_datums", recording)

    def role(temperature: float):
        return SimpleNamespace(config=SimpleNamespace(policy=SimpleNamespace(sampling=SimpleNamespace(temperature=temperature))))

    own, swapped, failed = make_episode(), make_episode(), make_episode()
    own.id, swapped.id, failed.id = "own", "swapped", "failed"
    swapped.adapters = {"b": "pro"}  # b's seat played by pro (a population's match, a self-play learner)
    failed.status = "error"
    run = loop.TrainingRun.__new__(loop.TrainingRun)
    run.team, run.roles = SimpleNamespace(roles={"a": role(0.0), "b": role(0.7)}), {"a": "pro", "b": "con"}
    run.cfg, run.published = TrainingConfig(max_staleness=2), {"pro": 5, "con": 5}
    advantages = [[{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 4.0}], [{"a": 5.0, "b": 6.0}]]
    items, lags, stale = run._datums("pro", [[own, swapped], [failed]], advantages, None)
    assert items == [((1.0, None), "own:a:1.0"), ((1.0, None), "swapped:a:3.0"), ((0.7, None), "swapped:b:4.0")]
    assert set(calls) == {3} and stale == {"pro/stale_dropped": 0}
    assert [d for _, d in run._datums("con", [[own, swapped], [failed]], advantages, None)[0]] == ["own:b:2.0"]
    run.cfg = TrainingConfig()
    assert run._datums("con", [[own]], advantages, None)[2] == {}  # no async training: no stale count


def test_a_rollouts_tasks_are_drawn_by_the_runs_seed_and_its_groups_are_consecutive_episodes(tmp_path, monkeypatch):
    """Another --seed draws other tasks for a step; the episodes come back in groups of group_size
    in the order played (task by task), each group one task's."""
    import asyncio
    from types import SimpleNamespace

    from orchestrator.rollout import RunResult
    from orchestrator.team import load_team
    from orchestrator.training import loop

    team = load_team(Path(__file__).resolve().parents[2] / "recipes/guess_number.yaml")
    drawn: list[list] = []

    async def play(team, policies, options):
        drawn.append([t["secret"] for t in team.tasks])
        return RunResult(tmp_path, {}, list(range(options.episodes)))

    monkeypatch.setattr(loop, "run_team", play)
    run = loop.TrainingRun.__new__(loop.TrainingRun)
    run.team, run.cfg, run.run_dir = team, team.config.training, tmp_path
    run.policies, run.concurrency, run.play, run.bar, run.clients = {}, 1, None, None, {}
    run.engine = SimpleNamespace(versions={})
    run.trainer = SimpleNamespace(adapters_for=lambda step, i: {})
    for seed in (0, 1):
        run.options = SimpleNamespace(seed=seed)
        groups = asyncio.run(run.rollout(1))
    size = run.cfg.group_size
    assert groups == [list(range(g * size, (g + 1) * size)) for g in range(run.cfg.groups_per_step)]
    assert drawn[0] != drawn[1]


def test_the_metric_helpers_average_over_the_rows_that_have_a_key():
    """_mean: a key some rows lack is their mean over those that have it (a grad_norm one optimizer
    step lacks is not pulled to 0); _token_mean of rows with no tokens is 0, not a ZeroDivisionError;
    _failures counts errors and timeouts apart."""
    from types import SimpleNamespace

    from orchestrator.training.loop import _failures, _mean, _token_mean

    assert _mean([{"loss": 1.0, "grad_norm": 2.0}, {"loss": 3.0}]) == {"loss": 2.0, "grad_norm": 2.0}
    assert _token_mean([{"tokens": 0.0, "kl": 0.5}, {"tokens": 3.0}], "kl") == 0.0
    statuses = ["ok", "error", "timeout", "timeout"]
    assert _failures([SimpleNamespace(status=s) for s in statuses]) == {"episodes_errored": 1, "episodes_timed_out": 2}


def test_credit_names_per_episode_the_adapter_that_played_each_trainable_role_and_whether_it_trained(tmp_path):
    """credit.jsonl: each trainable role's reward and advantage (not an untrained role's), its group,
    the adapter that played it (the trainer's override), and the roles whose adapter trained, none
    in a failed episode."""
    from types import SimpleNamespace

    from orchestrator.training import loop
    from support import make_episode

    own, swapped, failed = make_episode(), make_episode(), make_episode()
    own.id, swapped.id, failed.id = "own", "swapped", "failed"
    swapped.adapters = {"b": "pro"}
    failed.status = "error"
    run = loop.TrainingRun.__new__(loop.TrainingRun)
    run.team, run.roles, run.run_dir = SimpleNamespace(roles={"a": None, "b": None, "c": None}), {"a": "pro", "b": "con"}, tmp_path
    rewards = [[{"a": 1.0, "b": 2.0, "c": 9.0}, {"a": 3.0, "b": 4.0, "c": 9.0}], [{"a": 5.0, "b": 6.0, "c": 9.0}]]
    advantages = [[{"a": 0.5, "b": -0.5}, {"a": -0.5, "b": 0.5}], [{}]]
    run._write_credit(1, [[own, swapped], [failed]], rewards, advantages, None, ["pro"])
    lines = [json.loads(line) for line in (tmp_path / "rollouts/step-000001/credit.jsonl").read_text().splitlines()]
    assert [(c["episode"], c["group"], c["trained"]) for c in lines] == [("own", 0, ["a"]), ("swapped", 0, ["a", "b"]), ("failed", 1, [])]
    assert [c["adapters"] for c in lines] == [{"a": "pro", "b": "con"}, {"a": "pro", "b": "pro"}, {"a": "pro", "b": "con"}]
    assert lines[1]["rewards"] == {"a": 3.0, "b": 4.0} and lines[1]["advantages"] == {"a": -0.5, "b": 0.5}
    assert lines[2]["advantages"] == {"a": 0.0, "b": 0.0} and "turn_advantages" not in lines[0]


def test_last_checkpoint_is_the_newest_whole_one(tmp_path):
    """Of several whole checkpoints the newest; one lacking a file ``needs`` names, one whose step is
    not a number, or one its ``load`` finds damaged is passed over for the one before; none left
    where ``latest`` named one is one line; a run that never checkpointed has none."""
    from orchestrator.errors import RolecastError
    from orchestrator.training.loop import last_checkpoint

    assert last_checkpoint(tmp_path, "--resume") is None
    for step in (1, 2, 3, 4):
        write(tmp_path / "checkpoints" / f"step-{step:06d}" / "trainer.json", json.dumps({"step": step}))
        write(tmp_path / "checkpoints" / f"step-{step:06d}" / "rng.pt", "")
    assert last_checkpoint(tmp_path, "--resume", ["rng.pt"])[1] == {"step": 4}
    (tmp_path / "checkpoints" / "step-000004" / "rng.pt").unlink()
    write(tmp_path / "checkpoints" / "step-000003" / "trainer.json", '{"step": true}')
    loaded = []

    def load(folder, state):
        loaded.append(state["step"])
        if state["step"] == 2:
            raise ValueError("optimizer.pt is damaged")

    assert last_checkpoint(tmp_path, "--resume", ["rng.pt"], load)[0].name == "step-000001" and loaded == [2, 1]
    write(tmp_path / "checkpoints" / "latest", "step-000004")
    for folder in (tmp_path / "checkpoints").glob("step-*"):
        shutil.rmtree(folder)
    with pytest.raises(RolecastError, match="names step-000004, which is not there"):
        last_checkpoint(tmp_path, "--resume")


def test_a_minibatch_normalises_every_call_of_an_adapter_by_its_whole_batch():
    """An adapter's minibatch in two calls (a role with loss options of its own): each call's
    token-mean is over the adapter's whole batch (a call normalised by its own tokens alone gave
    its role the weight of the whole batch), the recipe's loss_config over the recipe defaults, each
    role's options its own; the row sums the calls."""
    from types import SimpleNamespace

    from orchestrator.config import TrainingConfig
    from orchestrator.training import loop

    class Done:
        def __init__(self, value):
            self.value = value

        async def result_async(self):
            return self.value

    calls = []

    async def forward_backward_many_async(given):
        calls.extend(given)
        return Done([SimpleNamespace(metrics={"loss": 1.0, "loss:sum": 2.0, "tokens": float(sum(d.mask().sum() for d in data))})
                     for _, data, _, _ in given])

    async def optim_step_async(params):
        return Done(SimpleNamespace(metrics={"grad_norm": 1.5}))

    def datum(mask):
        return SimpleNamespace(mask=lambda: torch.tensor(mask))

    run = loop.TrainingRun.__new__(loop.TrainingRun)
    run.cfg = TrainingConfig(loss_config={"aggregation": "sequence-mean"}, role_loss_config={"b": {"kl_coef": 0.5}})
    run.service = SimpleNamespace(forward_backward_many_async=forward_backward_many_async)
    run.clients = {"pro": SimpleNamespace(optim_step_async=optim_step_async)}
    batch = [((1.0, None), datum([0.0, 1.0, 1.0])), ((0.7, "b"), datum([1.0])), ((1.0, None), datum([1.0, 1.0]))]
    row = asyncio.run(run._minibatch({"pro": batch}))
    configs = {(c["temperature"], c.get("kl_coef")): c for _, _, _, c in calls}
    assert set(configs) == {(1.0, None), (0.7, 0.5)} and [len(data) for _, data, _, _ in calls] == [2, 1]
    assert all((c["batch_tokens"], c["batch_sequences"], c["aggregation"]) == (5.0, 3, "sequence-mean") for c in configs.values())
    assert row == {"pro": {"loss": 2.0, "loss:sum": 4.0, "tokens": 5.0, "grad_norm": 1.5}}


@pytest.mark.parametrize("start", [0, 3, 6, 7])  # a fresh run; resumed after step 2, after step 5, after the last
def test_the_steps_evaluations_and_checkpoints_of_a_run_and_of_a_resumed_one(tmp_path, start):
    """Every eval_every steps an evaluation (the last step's is the final one), every checkpoint_every
    steps and at the last a checkpoint, each step's rollout started once (max_staleness ahead, none
    past the last); a resume goes on at the step its checkpoint returns, and one past the last step
    trains nothing. The end-to-end runs evaluate every step, where any schedule evaluates each one."""
    from types import SimpleNamespace

    from orchestrator.config import TrainingConfig
    from orchestrator.training import loop

    seen, rolled = [], []
    run = loop.TrainingRun.__new__(loop.TrainingRun)
    run.cfg = TrainingConfig(eval_every=2, checkpoint_every=4, max_staleness=1)
    run.steps, run.run_dir, run.clients = 6, tmp_path, {}
    run.options = SimpleNamespace(resume=start > 0, progress=False, seed=0)

    async def resume():
        return start

    async def played(step):
        return step

    def rollout(step):
        rolled.append(step)
        return played(step)

    async def train_step(step, rollout):
        assert await rollout == step
        seen.append(("train", step))

    async def evaluate(step):
        seen.append(("eval", step))
        return {"step": step}

    async def finished():
        seen.append("finished")
        return {}

    async def publish_all():
        pass

    run._resume, run.rollout, run.train_step, run.evaluate, run._finished = resume, rollout, train_step, evaluate, finished
    run._publish_all, run._write_config, run._retire = publish_all, lambda: None, lambda pending: None
    run.checkpoint = lambda step: seen.append(("checkpoint", step))
    asyncio.run(run._run())
    if start > run.steps:
        assert seen == ["finished"] and not rolled
        return
    whole = [("eval", 0), ("train", 1), ("train", 2), ("eval", 2), ("train", 3), ("train", 4), ("eval", 4), ("checkpoint", 4),
             ("train", 5), ("train", 6), ("checkpoint", 6), ("eval", 6)]
    assert seen == whole[whole.index(("train", max(start, 1))) - (not start):]
    assert rolled == list(range(max(start, 1), run.steps + 1))
