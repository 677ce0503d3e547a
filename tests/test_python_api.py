"""``import rolecast``: the Python API runs, evaluates and trains as the commands do."""
from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rolecast
from orchestrator.launch import LOCK_FILE, claimed

ROOT = Path(__file__).resolve().parent.parent
SIGINT_AT_START = signal.getsignal(signal.SIGINT)  # before any test: what the process started with
SMALL = {"group_size": 2, "groups_per_step": 1, "eval_episodes": 2, "eval_every": 0}


@pytest.fixture
def python_sigint():
    """SIGINT left to Python's handler for the test, as a terminal or a kernel leaves it: a process
    started in the background (`cmd &`, nohup, some CI runners) inherits it ignored, and Python
    then installs none, nor does asyncio.run."""
    # An earlier test that left another SIGINT handler behind would make the test fail for that reason.
    assert signal.getsignal(signal.SIGINT) is SIGINT_AT_START
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def binary_search(request):
    """Guess the Number's guesser as a Python function: halves the range the feedback left."""
    return json.dumps({"guess": (request.context["lowest"] + request.context["highest"]) // 2})


def _holding_a_run(folder: Path) -> Path:
    """A run dir as a finished `rolecast train` leaves it, as far as a fresh run into it can tell."""
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("")
    return folder


def _adapter_dir(folder: Path, config: str) -> Path:
    """A folder with an adapter's files, its config holding ``config``."""
    (folder / "adapter").mkdir()
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"")
    (folder / "adapter" / "adapter_config.json").write_text(config)
    return folder / "adapter"


def _holding(folder: Path) -> subprocess.Popen:
    """Another process that holds ``folder`` as a run does (an flock on its lock file, its pid in
    it), until it is killed."""
    folder.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               "lock = open(sys.argv[1], 'w')\nfcntl.flock(lock, fcntl.LOCK_EX)\n"
                               "lock.write(f'{os.getpid()}\\n')\nlock.flush()\nprint('held', flush=True)\n"
                               "time.sleep(600)", str(folder / LOCK_FILE)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_run_dir_in_use_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    out = tmp_path / "run"
    holder = _holding(out)
    try:
        with pytest.raises(rolecast.RolecastError) as caught:
            rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=2, policies={"guesser": binary_search}, out=out,
                         progress=False)
        assert str(caught.value) == (f"{out} is in use by another rolecast process (pid {holder.pid}): wait for it "
                                     "or give another --out")
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing of the refused run's
    finally:
        holder.kill()
        holder.wait()
    # the killed holder's lock file is no obstacle, and a run's end leaves no lock file behind
    rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=2, policies={"guesser": binary_search}, out=out,
                 progress=False)
    assert (out / "summary.json").is_file() and not (out / LOCK_FILE).exists()


def test_two_holds_in_one_process_conflict_and_a_hold_leaves_no_folder_it_made_empty(tmp_path):
    """flock locks belong to an open file: a second call in this process (a thread, a notebook) is
    refused as another process is."""
    out = tmp_path / "runs" / "eval"
    with claimed(out):
        with pytest.raises(rolecast.RolecastError, match=f"{out} is in use by another rolecast process \\(pid {os.getpid()}\\)"):
            rolecast.evaluate(ROOT / "recipes/guess_number.yaml", episodes=2, policies={"guesser": binary_search},
                              out=out, progress=False)
    assert not (tmp_path / "runs").exists()


def test_a_file_system_without_locks_runs_unguarded_and_says_so(tmp_path, monkeypatch, capsys):
    def no_flock(fd, operation):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr("fcntl.flock", no_flock)
    result = rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=2, policies={"guesser": binary_search},
                          out=tmp_path / "run", progress=False)
    assert result.summary["status"] == {"ok": 2} and not (tmp_path / "run" / LOCK_FILE).exists()
    assert "cannot lock the run dir" in capsys.readouterr().err


def test_a_hold_writes_its_pid_over_a_killed_holders_longer_one(tmp_path):
    """A killed run leaves its lock file: the pid written over it, untruncated, kept the old one's
    tail, and a refused run named the holder as "123\n4567"."""
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text("9" * 20 + "\n")
    with claimed(out):
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_a_hold_on_the_lock_file_its_holder_removed_meanwhile_takes_the_one_at_the_path(tmp_path, monkeypatch):
    """The holder unlinks the lock file as it lets go: one opened just before then is locked in
    vain (a third run creates and locks another), so the hold opens the file at the path anew."""
    out, flock, removed = tmp_path / "run", fcntl.flock, []

    def holder_lets_go_first(fd, operation):
        if not removed:
            removed.append(out / LOCK_FILE)
            os.unlink(out / LOCK_FILE)
        flock(fd, operation)

    monkeypatch.setattr("fcntl.flock", holder_lets_go_first)
    with claimed(out):
        assert removed and (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_run_plays_a_callable_policy_and_records_it(tmp_path):
    result = rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=4, tasks=["16", {"secret": 3}], seed=0,
                          policies={"guesser": binary_search}, out=tmp_path / "run", progress=False)
    assert isinstance(result, rolecast.RunResult) and result.run_dir == tmp_path / "run"
    assert result.summary["status"] == {"ok": 4}
    assert [e.task for e in result.episodes] == [{"secret": 16}, {"secret": 3}] * 2
    assert result.summary["roles"]["guesser"]["mean_reward"] == 1.0  # binary search finds 1..16 in 5
    recorded = yaml.safe_load((tmp_path / "run/config.yaml").read_text())["run"]
    assert recorded["policy"] == ["guesser=python:test_python_api:binary_search"] and recorded["episodes"] == 4
    assert recorded["seed"] == 0  # seed=0 is given, not refused as no seed


def test_run_and_evaluate_stop_each_episode_at_the_timeout_given(tmp_path):
    async def thinks_too_long(request):
        await asyncio.sleep(5)

    result = rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=2, timeout=0.2,
                          policies={"guesser": thinks_too_long}, out=tmp_path / "run", progress=False)
    assert result.summary["status"] == {"timeout": 2}
    # and evaluate's, which had no timeout: a stuck policy held each episode for the team's episode_timeout_s (900 s)
    evaluation = rolecast.evaluate(ROOT / "recipes/guess_number.yaml", episodes=2, timeout=0.2,
                                   policies={"guesser": thinks_too_long}, out=tmp_path / "eval", progress=False)
    assert evaluation.report["status"] == {"timeout": 2}


def test_a_model_dir_given_as_a_path_is_recorded_as_text(tmp_path):
    """config.yaml could not hold a Path: the run failed at its first write, after the model loaded."""
    result = rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=1, policies={"guesser": binary_search},
                          model=tmp_path / "model", out=tmp_path / "run", progress=False)
    assert result.summary["status"] == {"ok": 1}
    assert yaml.safe_load((tmp_path / "run/config.yaml").read_text())["run"]["model"] == str(tmp_path / "model")


def test_a_run_never_writes_out_its_result_whole(tmp_path, monkeypatch, python_sigint):
    # asyncio.run's SIGINT restore reprs its main task, result and all: every record of a big run
    written = []
    monkeypatch.setattr(rolecast.RunResult, "__repr__", lambda self: written.append(self) or "RunResult")
    rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=2, policies={"guesser": binary_search},
                 out=tmp_path / "run", progress=False)
    assert written == []


def test_a_call_inside_a_running_event_loop_works_as_in_a_notebook(tmp_path):
    async def cell():  # a Jupyter cell runs inside the kernel's loop: asyncio.run would refuse
        return rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=2, policies={"guesser": binary_search},
                            out=tmp_path / "run", progress=False)

    assert asyncio.run(cell()).summary["status"] == {"ok": 2}


def test_a_run_whose_openai_requests_failed_leaves_no_threads(tmp_path):
    """A failed request's traceback kept the policy in a reference cycle: its threads outlived the run."""
    import socket
    import threading

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}/v1"  # nothing listens: connection refused
    result = rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=2, policies={"guesser": f"openai:base@{url}"},
                          out=tmp_path / "run", progress=False)
    assert result.summary["status"] == {"error": 2}
    for thread in threading.enumerate():
        if thread.name.startswith("openai-policy"):
            thread.join(5)
            assert not thread.is_alive()


def test_evaluate_reports_rates_against_a_rebound_opponent(tmp_path):
    evaluation = rolecast.evaluate(ROOT / "recipes/tictactoe.yaml", episodes=4, opponent="minimax",
                                   policies={"x": "builtin:minimax"}, out=tmp_path / "eval", progress=False)
    report = evaluation.report
    assert report["opponent"]["policy"] == "minimax" and report["episodes"] == 4
    assert sum(report["roles"]["x"][k] for k in ("win", "draw", "loss")) == 4
    assert report["roles"]["x"]["draw"] == 4  # minimax against minimax: every game a draw
    assert json.loads((tmp_path / "eval/eval.json").read_text()) == json.loads(json.dumps(report))
    assert evaluation.run.summary["status"] == {"ok": 4}


def test_evaluate_without_episodes_plays_its_default(tmp_path):
    """episodes=None, as run() takes it, failed after the run dir was made: its config.yaml there
    refused the next try."""
    evaluation = rolecast.evaluate(ROOT / "recipes/tictactoe.yaml", episodes=None, out=tmp_path / "eval",
                                   policies={"x": "builtin:random", "o": "builtin:random"}, progress=False)
    assert evaluation.report["episodes"] == 100


def test_train_then_resume_with_the_options_the_run_started_with(tmp_path):
    out = tmp_path / "train"
    trained = rolecast.train(ROOT / "recipes/guess_number.yaml", steps=1, out=out, sets=SMALL, model="tiny",
                             dtype="float32", progress=False)
    assert trained.run_dir == out and trained.final["kind"] == "eval" and trained.final["step"] == 1
    assert (out / "sampler" / "guesser" / "adapter_config.json").is_file()
    assert not (out / LOCK_FILE).exists()  # let go of at the end
    # while another process holds the run dir, a resume into it is refused; once it is killed, it goes on
    holder = _holding(out)
    with pytest.raises(rolecast.RolecastError, match=f"{out} is in use by another rolecast process "
                       rf"\(pid {holder.pid}\): wait for it or give another --out"):
        rolecast.train(ROOT / "recipes/guess_number.yaml", steps=2, out=out, sets=SMALL, resume=True, progress=False)
    holder.kill()
    holder.wait()
    # no model and no seed given: the run's own (tiny, 0) are used; the budget grows to 2 steps
    again = rolecast.train(ROOT / "recipes/guess_number.yaml", steps=2, out=out, sets=SMALL, resume=True,
                           dtype="float32", progress=False)
    assert again.final["step"] == 2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 1), ("eval", 1), ("train", 2), ("eval", 2)]


def test_episodes_that_fail_are_no_part_of_the_mean_reward(tmp_path):
    """Their rewards are placeholders (zeros): counted, the mean of four episodes that won two and
    crashed two read 0.5 beside a W-D-L of 2-0-0."""
    def crashes_on_odd(request):
        if request.episode_index % 2:
            raise RuntimeError("boom")
        return binary_search(request)

    result = rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=4, tasks=["16"], policies={"guesser": crashes_on_odd},
                          out=tmp_path / "run", progress=False)
    assert result.summary["status"] == {"ok": 2, "error": 2}
    assert result.summary["roles"]["guesser"]["mean_reward"] == 1.0


def test_load_team_applies_training_options():
    team = rolecast.load_team(ROOT / "recipes/guess_number.yaml", sets={"group_size": 3, "adam.learning_rate": 1e-3})
    assert team.config.training.group_size == 3 and team.config.training.adam.learning_rate == 1e-3
    # a loaded Team, as the argument check allows (it was a TypeError from the YAML reader)
    again = rolecast.load_team(team, sets={"group_size": 5})
    assert again.config.training.group_size == 5 and again.config.training.adam.learning_rate == 1e-3


def test_set_steps_alone_or_with_the_same_steps_is_the_budget():
    """``--set steps=N`` is ``--steps N``: given alone, or with --steps of the same N, it is no disagreement."""
    from orchestrator.api import steps_given

    team = rolecast.load_team(ROOT / "recipes/guess_number.yaml", sets={"steps": 3})
    assert steps_given(team, {"steps": 3}, None) == steps_given(team, {"steps": 3}, 3) == 3
    assert steps_given(team, {}, 7) == 7


def test_numpy_numbers_in_sets_are_plain_numbers():
    """A sweep's grid gives np.float32: a free-form option (reward_config) kept it, and config.yaml's
    write failed after the model loaded."""
    import numpy as np
    import yaml

    team = rolecast.load_team(ROOT / "recipes/guess_number.yaml",
                              sets={"reward_config.alpha": np.float32(0.5), "group_size": np.int64(3)})
    training = team.config.training
    assert (type(training.reward_config["alpha"]), training.reward_config["alpha"], training.group_size) == (float, 0.5, 3)
    yaml.safe_dump(team.resolved())  # as config.yaml is written
    for array in (np.zeros(2), np.zeros(1)):  # an array is no number, though it hold one
        with pytest.raises(rolecast.RolecastError, match="--set reward_config.alpha: not plain data"):
            rolecast.load_team(ROOT / "recipes/guess_number.yaml", sets={"reward_config.alpha": array})


@pytest.mark.parametrize("call, message", [
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=0, out=out),
     "episodes=0: must be a whole number above 0"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=2.5, out=out),
     "episodes=2.5: must be a whole number above 0"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", tasks="13", out=out),
     "tasks='13': must be a list of one or more tasks"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", tasks=[], out=out), "tasks=[]: must be a list"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", tasks=["3", None], out=out),
     "tasks=['3', None]: must be a list of one or more tasks (text"),  # a TypeError from int()
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", tasks=[3.5], out=out),
     "tasks=[3.5]: must be a list"),  # it played secret 3
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", seed=2**70, out=out),
     "must be a whole number from 0 to 2**63 - 1"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", seed=-1, out=out),
     "seed=-1: must be a whole number from 0 to 2**63 - 1"),
    # 0 read as "not given": the recipe's own timeout and concurrency, said nowhere
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", timeout=0, out=out),
     "timeout=0: must be a number of seconds above 0"),
    (lambda out: rolecast.evaluate(ROOT / "recipes/tictactoe.yaml", concurrency=0, out=out),
     "concurrency=0: must be a whole number above 0"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", policies=["guesser"], out=out),
     "policies=['guesser']: must be a mapping"),
    (lambda out: rolecast.run(42, out=out), "team=42: must be a team file's path, a mapping, or a Team"),
    # each of these was a TypeError or AttributeError from deep inside
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", out=5), "out=5: must be a folder's path"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", out=""), "out='': must be a folder's path"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", policies={1: "builtin:stub"}, out=out),
     "policies={1: 'builtin:stub'}: must be a mapping of role names to bindings"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", adapters={"guesser": 5}, out=out),
     "adapters={'guesser': 5}: must be a mapping of names to adapter dirs"),
    (lambda out: rolecast.evaluate(ROOT / "recipes/tictactoe.yaml", opponent=5, out=out), "opponent=5: must be text"),
    (lambda out: rolecast.evaluate(ROOT / "recipes/tictactoe.yaml", opponent="", out=out),
     "--opponent : tictactoe: unknown opponent ''"),  # it played the recipe's own binding, the report naming none
    (lambda out: rolecast.evaluate(ROOT / "recipes/tictactoe.yaml", held_out="no", out=out),
     "held_out='no': must be True or False"),  # truthy: it played the eval tasks
    (lambda out: rolecast.train(ROOT / "recipes/guess_number.yaml", resume="false", out=out),
     "resume='false': must be True or False"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", progress=0, out=out), "progress=0: must be True or False"),
    (lambda out: rolecast.load_team(42), "source=42: must be a team file's path"),
    (lambda out: rolecast.load_team(ROOT / "recipes/guess_number.yaml", sets=["group_size=4"]),
     "sets=['group_size=4']: must be a mapping"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", model=5, out=out), "--model 5: give a model name"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", model="", out=out), "--model '': give a model name"),
    (lambda out: rolecast.train(ROOT / "recipes/guess_number.yaml", steps="2", out=out),
     "steps='2': must be a whole number above 0"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", out=Path("/proc/rolecast-run")),
     "--out /proc/rolecast-run: cannot make this folder"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", dtype="fp16", out=out), "--dtype fp16: use one of"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", ray=True, out=out), "--ray True: give local, or"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", ray="local", rollout_workers=True, out=out),
     "--rollout-workers True: must be a whole number"),  # True is no count: it played on 1 worker
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", ray="local", rollout_workers=0, out=out),
     "--rollout-workers 0: must be a whole number of at least 1"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", engine="tgi", out=out), "--engine tgi: use one of"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", adapters={"guesser": _adapter_dir(out.parent, "[]")},
                              out=out), "its adapter_config.json is not a JSON object"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", rollout_workers=4, out=out),
     "--rollout-workers 4: rollout workers are Ray's; add --ray"),  # it played in this process, saying nothing
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", policies={"chef": "builtin:stub"}, out=out),
     "unknown role(s) chef"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", policies={"guesser": "replay:nope.jsonl"}, out=out),
     "--policy guesser=replay:nope.jsonl: replay file not found"),
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", tasks=["abc"], out=out),
     "--task abc: the secret is a whole number"),
    (lambda out: rolecast.run(ROOT / "recipes/code_pair.yaml", tasks=[{"spec": "double x"}], out=out),
     "--task {'spec': 'double x'}: reference: required key is missing"),  # which key, it had not said
    (lambda out: rolecast.run(ROOT / "recipes/guess_number.yaml", tasks=[{"secret": 3, "note": Path("a")}], out=out),
     "--task {'secret': 3, 'note': PosixPath('a')}: not plain data"),  # config.yaml's write failed, the model loaded
    # `--task café` under LC_ALL=C: every episode failed in the tokenizer ("TypeError: TextEncodeInput must be ...")
    (lambda out: rolecast.run(ROOT / "recipes/debate.yaml", tasks=["caf\udcc3\udca9"], out=out),
     "--task caf\udcc3\udca9: text that is not valid Unicode (a lone surrogate"),
    (lambda out: rolecast.train(ROOT / "recipes/guess_number.yaml", sets={"trainer": "population"}, out=out),
     "--set trainer: not a settable option"),
    (lambda out: rolecast.train(ROOT / "recipes/guess_number.yaml", sets={16: 2}, out=out),
     "--set 16: not a settable option"),
    (lambda out: rolecast.train(ROOT / "recipes/guess_number.yaml", steps=1, sets={"steps": 3}, out=out),
     "--steps 1 and --set steps=3 disagree: give one"),  # it trained 1 step, config.yaml's recipe saying 3
    (lambda out: rolecast.train(ROOT / "recipes/guess_number.yaml", resume=True), "--resume needs --out"),
    (lambda out: rolecast.train(ROOT / "recipes/code_review.yaml", out=out), "has no `training:` block"),
    (lambda out: rolecast.train(ROOT / "recipes/guess_number.yaml", out=_holding_a_run(out.parent / "done")),
     "already holds a training run: add --resume"),
    (lambda out: rolecast.load_team(ROOT / "recipes/nope.yaml"), "nope.yaml"),
])
def test_mistakes_are_one_line_errors_before_any_model_loads(tmp_path, monkeypatch, call, message):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the mistake was found")

    monkeypatch.setattr("orchestrator.engines.load.load_engine", no_model)
    with pytest.raises(rolecast.RolecastError) as caught:
        call(tmp_path / "out")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_an_adapter_dir_is_taken_with_its_weights_as_bin_and_refused_without_weights(tmp_path):
    """Older PEFT saves adapter_model.bin, which the engines load: a mutant refusing it passed every test."""
    from orchestrator.launch import adapter_dirs

    folder = _adapter_dir(tmp_path, "{}")
    (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")
    assert adapter_dirs({"guesser": folder}) == {"guesser": folder}
    (folder / "adapter_model.bin").unlink()
    with pytest.raises(rolecast.RolecastError, match=r"no adapter_model.safetensors \(or .bin\) beside its config$"):
        adapter_dirs({"guesser": folder})


def test_training_starts_the_engine_with_room_for_the_recipes_lora_rank(tmp_path, monkeypatch):
    """vLLM preallocates its adapter slots at a fixed rank: it must know the recipe's before the
    first update, not refuse that update mid-run."""
    seen = {}

    def engine_seen(*args, **kwargs):
        seen.update(kwargs)
        raise rolecast.RolecastError("stop here")

    monkeypatch.setattr("orchestrator.engines.load.load_engine", engine_seen)
    with pytest.raises(rolecast.RolecastError, match="stop here"):
        rolecast.train(ROOT / "recipes/guess_number.yaml", sets={"lora.rank": 128}, out=tmp_path / "out")
    assert seen["lora_rank"] == 128
    # and an eval opponent's checkpoint of a higher rank, loaded into the same engine
    (tmp_path / "opponent").mkdir()
    (tmp_path / "opponent/adapter_config.json").write_text('{"r": 200}')
    team = rolecast.load_team(ROOT / "recipes/rps.yaml")
    training = team.config.training.model_copy(update={"eval_opponent": f"checkpoint:{tmp_path / 'opponent'}"})
    team = dataclasses.replace(team, config=team.config.model_copy(update={"training": training}))
    with pytest.raises(rolecast.RolecastError, match="stop here"):
        rolecast.train(team, out=tmp_path / "out2")
    assert seen["lora_rank"] == 200


@pytest.fixture
def registry():
    from orchestrator.registry import default_registry

    default_registry.cache_clear()
    yield default_registry()
    default_registry.cache_clear()


def test_a_plugin_defined_in_this_process_plays_a_team(tmp_path, registry):
    from orchestrator.envs.game import GameConfig, GameEnv
    from orchestrator.policies.python import PythonPolicy

    class CoinConfig(GameConfig):
        players: list[str] = ["caller"]

    class CoinEnv(GameEnv):  # as docs/environments.md writes one
        Config = CoinConfig
        observation_keys = frozenset({"observation", "legal_moves"})
        move_field = "move"

        def next_role(self):
            return None if self.done else self.config.players[0]

        def observe(self, role):
            return {"observation": "I flip a coin. Call it.", "legal_moves": ["heads", "tails"]}

        async def step(self, role, message):
            won = message.valid and message.content["move"] == "heads"  # a coin with two heads
            return self.finish({role: "win" if won else "loss"}, {role: 1.0 if won else 0.0}, "flip")

    class Coins:  # what a notebook writes instead of a module with an entry point
        @rolecast.hookimpl
        def register_envs(register):
            register("coin", CoinEnv)

        @rolecast.hookimpl
        def register_policies(register):
            register("heads", lambda spec: PythonPolicy(lambda request: '{"move": "heads"}'))

    team = tmp_path / "coin.yaml"
    team.write_text("name: coin\nprotocol: {type: coin}\nroles: [{use: game_player, name: caller}]\ntasks: [{}]\n")
    with pytest.raises(rolecast.RolecastError, match="unknown protocol|unknown env plugin 'coin'"):
        rolecast.load_team(team)
    rolecast.register_plugin(Coins)
    rolecast.register_plugin(Coins)  # a cell run twice
    assert registry.plugins.count(("Coins", f"in-process ({__name__})")) == 1
    result = rolecast.run(team, episodes=3, policies={"caller": "builtin:heads"}, out=tmp_path / "run", progress=False)
    assert result.summary["roles"]["caller"]["mean_reward"] == 1.0


def test_a_task_value_for_a_plugins_env_that_reads_other_keys_says_how_it_was_read(tmp_path, registry):
    """`--task 3` on an env whose Task reads `target` said only "target: required key is missing":
    the default reading, {"text": "3"}, was nowhere."""
    from orchestrator.envs.base import TaskConfig
    from orchestrator.envs.rps import RPSEnv

    class TargetTask(TaskConfig):
        target: int

    class TargetEnv(RPSEnv):
        Task = TargetTask
        task_from_cli = classmethod(lambda cls, value: {"target": int(value)})

    class PlainEnv(TargetEnv):
        task_from_cli = RPSEnv.task_from_cli

    class Plugin:
        @rolecast.hookimpl
        def register_envs(register):
            register("target", TargetEnv)
            register("plain", PlainEnv)

    rolecast.register_plugin(Plugin)
    recipe = (ROOT / "recipes/rps.yaml").read_text()
    for protocol, words in (("plain", '--task 3: target: required key is missing (this protocol reads --task VALUE as '
                                      '{"text": VALUE}: give whole tasks in a team file, or override PlainEnv.task_from_cli)'),
                            ("target", "--task x: invalid literal for int()")):
        (tmp_path / f"{protocol}.yaml").write_text(recipe.replace("type: rps", f"type: {protocol}")
                                                   .replace("tasks: [{}]", "tasks: [{target: 1}]"))
        team = rolecast.load_team(tmp_path / f"{protocol}.yaml")
        with pytest.raises(rolecast.RolecastError, match=re.escape(words)):
            rolecast.run(team, tasks=["3" if protocol == "plain" else "x"], out=tmp_path / protocol / "run", progress=False)


def test_a_plugin_that_breaks_the_contract_raises_and_registers_nothing(registry):
    from orchestrator.envs.guess_number import GuessNumberEnv

    class Broken:
        @rolecast.hookimpl
        def register_envs(register):
            register("half", GuessNumberEnv)
            raise RuntimeError("no")

    class Misspelt:
        @rolecast.hookimpl
        def register_env(register):  # not a hook
            pass

    for plugin, problem in ((Broken, "plugin Broken: register_envs: RuntimeError: no"), (Misspelt, "register_env")):
        with pytest.raises(rolecast.RolecastError, match=problem):
            rolecast.register_plugin(plugin)
    assert "half" not in registry.items["envs"] and not registry.failures
    for plugin, name, problem in ((None, None, "has no hook"), (5, "five", "has no hook"),
                                  (Broken, "core", "the name of an installed plugin"),
                                  (Broken, "", "plugin name='': must be a non-empty string"),
                                  (Broken, 5, "plugin name=5: must be a non-empty string")):
        with pytest.raises(rolecast.RolecastError, match=problem):
            rolecast.register_plugin(plugin, name=name)
    assert "grpo" in registry.items["trainers"]


def test_an_interrupt_in_a_notebook_cancels_the_work_instead_of_waiting_for_it(tmp_path, python_sigint):
    import threading
    import time

    calls = []

    async def slow(request):
        calls.append(1)
        if len(calls) == 20:  # a few episodes in: the stop button (ipykernel sends SIGINT)
            # to the main thread, whose wait it must interrupt (a signal sent to the process may go
            # to any thread that does not block it; once, under the full suite, this test saw none)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        await asyncio.sleep(0.05)
        return binary_search(request)

    async def cell():
        return rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=400, concurrency=1, policies={"guesser": slow},
                            out=tmp_path / "run", progress=False)

    # a kernel's loop (unlike asyncio.run's) leaves SIGINT to Python's handler: KeyboardInterrupt
    loop = asyncio.new_event_loop()
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(cell())
    finally:
        loop.close()
    assert time.perf_counter() - t0 < 20  # 400 episodes of 2-5 turns of 0.05 s each would take over a minute
    finished = (tmp_path / "run/transcripts.jsonl").read_text().splitlines()
    assert 0 < len(finished) < 20 and len(calls) < 25


def test_import_sends_logs_to_stderr_unless_structlog_was_set_up_first():
    import subprocess
    import sys

    code = "import structlog{}; import rolecast; structlog.get_logger().info('engine', device='cpu')"
    plain = subprocess.run([sys.executable, "-c", code.format("")], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and plain.stdout == "" and "engine" in plain.stderr
    mine = "; structlog.configure(processors=[structlog.processors.JSONRenderer()])"
    theirs = subprocess.run([sys.executable, "-c", code.format(mine)], capture_output=True, text=True, timeout=120)
    assert theirs.returncode == 0 and json.loads(theirs.stdout) == {"event": "engine", "device": "cpu"}


def test_runs_started_in_the_same_second_get_run_dirs_of_their_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20261125-120000")
    dirs = [rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=1, policies={"guesser": binary_search},
                         progress=False).run_dir for _ in range(3)]
    assert [d.name for d in dirs] == ["guess_number-20261125-120000", "guess_number-20261125-120000-2",
                                      "guess_number-20261125-120000-3"]
    assert all(len((tmp_path / d / "transcripts.jsonl").read_text().splitlines()) == 1 for d in dirs)


def test_runs_started_together_in_threads_get_run_dirs_of_their_own(tmp_path, monkeypatch):
    """Calls through asyncio.to_thread picked the same name (none had made its folder yet) and
    mixed their transcripts in it, or one failed on the other's folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20261126-120000")
    (tmp_path / "runs").mkdir()  # as the first run leaves it

    async def together():
        return await asyncio.gather(*(asyncio.to_thread(rolecast.run, ROOT / "recipes/guess_number.yaml", episodes=1,
                                                        policies={"guesser": binary_search}, progress=False)
                                      for _ in range(3)))

    dirs = [result.run_dir for result in asyncio.run(together())]
    assert len(set(dirs)) == 3
    assert all(len((tmp_path / d / "transcripts.jsonl").read_text().splitlines()) == 1 for d in dirs)


def test_the_creatable_probe_leaves_a_parent_another_run_made_its_folder_in(tmp_path, monkeypatch):
    from orchestrator.launch import run_dir

    out, beside = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    rmdir = Path.rmdir

    def rmdir_while_another_starts(self):
        if self == out:
            beside.mkdir()
        rmdir(self)

    monkeypatch.setattr(Path, "rmdir", rmdir_while_another_starts)
    assert run_dir(out, "a") == out
    assert not out.exists() and beside.is_dir()


def test_the_creatable_probe_leaves_none_of_the_folders_it_made(tmp_path):
    from orchestrator.launch import run_dir

    out = tmp_path / "a" / "b" / "run"
    assert run_dir(out, "a") == out and not (tmp_path / "a").exists()


def test_a_default_run_dir_skips_the_folder_an_earlier_process_left(tmp_path, monkeypatch):
    """Only this process's own names were checked, then the run wrote into another's folder."""
    from orchestrator.launch import run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20261127-120000")
    (tmp_path / "runs" / "a-20261127-120000").mkdir(parents=True)
    assert run_dir(None, "a") == Path("runs/a-20261127-120000-2")


def test_a_file_named_runs_is_one_line_without_out_too(tmp_path, monkeypatch):
    """Only a given ``out`` was checked: without one, a file named runs here was a NotADirectoryError
    traceback when the run first wrote (after the model had loaded)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("")
    with pytest.raises(rolecast.RolecastError, match=r"runs/guess_number-\S+: runs is a file, not a folder"):
        rolecast.run(ROOT / "recipes/guess_number.yaml", episodes=1, policies={"guesser": binary_search}, progress=False)


def test_a_team_written_in_code_runs_as_its_file_would(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secrets.yaml").write_text("[{secret: 3}, {secret: 11}]\n")  # relative paths: from here
    team = {"name": "guess", "protocol": {"type": "guess_number", "players": ["guesser"], "low": 1, "high": 16, "turns": 5},
            "roles": [{"use": "number_guesser", "name": "guesser"}], "tasks": "secrets.yaml"}
    result = rolecast.run(team, episodes=2, policies={"guesser": binary_search}, out="run", progress=False)
    assert [e.task for e in result.episodes] == [{"secret": 3}, {"secret": 11}]
    assert result.summary["roles"]["guesser"]["mean_reward"] == 1.0
    team["protocol"]["turns"] = 0  # the caller's mapping was copied, not kept
    assert yaml.safe_load((tmp_path / "run/config.yaml").read_text())["team"]["protocol"]["turns"] == 5
    for bad, message in (({**team, "protocl": 1}, "<inline team>: protocl: unknown key"),
                         ({**team, "tasks": {1, 2}}, "<inline team>: (root): not plain data")):
        with pytest.raises(rolecast.ConfigError) as caught:
            rolecast.run(bad)
        assert str(caught.value).startswith(message)


def caller_game(name: str, tasks: list[dict], episodes: int, out, **methods):
    """Run a one-role game plugin (the caller calls "heads" and wins 1.0) whose env overrides
    ``methods``; every episode replies the same."""
    from orchestrator.envs.game import GameConfig, GameEnv

    class CallerConfig(GameConfig):
        players: list[str] = ["caller"]

    class Base(GameEnv):
        Config = CallerConfig
        observation_keys = frozenset({"observation", "legal_moves"})

        def next_role(self):
            return None if self.done else "caller"

        def observe(self, role):
            return {"observation": "Call it.", "legal_moves": ["heads"]}

        async def step(self, role, message):
            return self.finish({role: "win"}, {role: 1.0}, "flip")

    env = type(f"{name.title()}Env", (Base,), methods)

    class Plugin:
        @rolecast.hookimpl
        def register_envs(register):
            register(name, env)

    rolecast.register_plugin(Plugin)
    team = {"name": name, "protocol": {"type": name}, "roles": [{"use": "game_player", "name": "caller"}], "tasks": tasks}
    return rolecast.run(team, episodes=episodes, policies={"caller": lambda request: '{"move": "heads"}'},
                        out=out, progress=False)


def test_rewards_an_env_cannot_pay_end_that_episode_not_the_run(tmp_path, registry):
    """NaN made summary.json invalid JSON, a numpy float crashed the run with no transcript
    written, and a reward to a misspelt role credited no one, silently."""
    import numpy as np

    async def step(self, role, message):
        paid = {"nan": {role: float("nan")}, "ghost": {"calller": 1.0}, "numpy": {role: np.float32(1.0)}}
        return self.finish({role: "win"}, paid[self.task["pay"]], "flip")

    result = caller_game("pay", [{"pay": "nan"}, {"pay": "ghost"}, {"pay": "numpy"}], 3, tmp_path / "run", step=step)
    assert [e.status for e in result.episodes] == ["error", "error", "ok"]
    assert "'caller' a reward of nan: not a finite number" in result.episodes[0].error
    assert "paid a reward to 'calller', not a role of the team (caller)" in result.episodes[1].error
    assert result.summary["roles"]["caller"]["mean_reward"] == 1.0

    def strict(constant):
        raise ValueError(f"not JSON: {constant}")

    json.loads((tmp_path / "run/summary.json").read_text(), parse_constant=strict)
    lines = (tmp_path / "run/transcripts.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line, parse_constant=strict) for line in lines)


def test_a_score_an_env_cannot_give_ends_that_episode(tmp_path, registry):
    """A move's score (turn credit) is held to a reward's rules: NaN is an error, a numpy float a float."""
    import numpy as np
    from orchestrator.envs.base import StepResult

    async def step(self, role, message):
        self.done = True
        return StepResult(rewards={role: 1.0}, done=True, score={"nan": float("nan"), "numpy": np.float32(0.5)}[self.task["score"]])

    result = caller_game("scored", [{"score": "nan"}, {"score": "numpy"}], 2, tmp_path / "run", step=step)
    assert [e.status for e in result.episodes] == ["error", "ok"]
    assert "ScoredEnv.step gave 'caller' a score of nan: not a finite number" in result.episodes[0].error
    assert type(score := result.episodes[1].turns[0].score) is float and score == 0.5


def test_an_outcome_no_transcript_can_hold_ends_that_episode_not_the_run(tmp_path, registry):
    """A numpy int in outcome() made the first transcript line fail to write: the run died with a
    traceback, no transcript line and no summary."""
    import numpy as np
    from orchestrator.envs.game import GameEnv

    def outcome(self):
        return {**GameEnv.outcome(self), "flips": np.int64(1) if self.task["numpy"] else 1}

    result = caller_game("count", [{"numpy": True}, {"numpy": False}], 2, tmp_path / "run", outcome=outcome)
    assert [e.status for e in result.episodes] == ["error", "ok"]
    assert "CountEnv.outcome() holds what a transcript cannot write: int64 value" in result.episodes[0].error
    assert result.episodes[1].outcome["flips"] == 1 and result.summary["roles"]["caller"]["mean_reward"] == 1.0
    assert len((tmp_path / "run/transcripts.jsonl").read_text().splitlines()) == 2


def test_an_outcome_is_kept_as_its_transcript_line_reads_back(tmp_path, registry):
    """A tuple and a number key in outcome() stayed as they were in the run's episodes and what its
    summary and outcome_metrics saw, while transcripts.jsonl read back a list and a text key: the
    same run gave two different outcomes, by where it was read."""
    from orchestrator.envs.game import GameEnv
    from orchestrator.transcript import EpisodeRecord

    def outcome(self):
        return {**GameEnv.outcome(self), "cells": (0, 4), "by_turn": {1: "heads"}}

    seen = []

    @classmethod
    def outcome_metrics(cls, config, outcomes):
        seen.extend(outcomes)
        return {}

    result = caller_game("shaped", [{}], 1, tmp_path / "run", outcome=outcome, outcome_metrics=outcome_metrics)
    (line,) = (tmp_path / "run/transcripts.jsonl").read_text().splitlines()
    assert result.episodes[0].outcome == seen[0] == EpisodeRecord.loads(line).outcome
    assert seen[0]["cells"] == [0, 4] and seen[0]["by_turn"] == {"1": "heads"}


def test_outcome_metrics_that_raise_cost_the_measures_not_the_summary(tmp_path, registry, capsys):
    """They ran after every episode had played: the run died there with a traceback and no
    summary.json (a training run, at its first evaluation)."""
    def outcome_metrics(cls, config, outcomes):
        return {"flips": len(outcomes) / 0}

    result = caller_game("tally", [{}], 2, tmp_path / "run", outcome_metrics=classmethod(outcome_metrics))
    assert result.summary["status"] == {"ok": 2} and result.summary["env"] == {}
    assert json.loads((tmp_path / "run/summary.json").read_text())["roles"]["caller"]["mean_reward"] == 1.0
    assert "outcome_metrics failed" in capsys.readouterr().err


def test_an_env_fault_is_named_not_hidden(tmp_path, registry, capsys):
    """A close() that raised after a step had raised replaced the step's error in the record, and
    a next_role() naming no role of the team was recorded as a bare KeyError."""
    async def step(self, role, message):
        raise RuntimeError("the dice fell off the table")

    async def close(self):
        raise OSError("the table is gone")

    def next_role(self):
        return "ghost"

    broken = caller_game("broken", [{}], 1, tmp_path / "broken", step=step, close=close)
    assert broken.episodes[0].error == "RuntimeError: the dice fell off the table"
    assert "env close failed" in (err := capsys.readouterr().err) and "OSError: the table is gone" in err
    lost = caller_game("lost", [{}], 1, tmp_path / "lost", next_role=next_role)
    assert lost.episodes[0].error == "ValueError: LostEnv.next_role gave 'ghost', not a role of the team (caller)"


def test_a_step_that_returns_no_step_result_is_named(tmp_path, registry):
    """A step that returned nothing for a turn that pays nothing (or its rewards as a dict) ended the
    episode as "AttributeError: 'NoneType' object has no attribute 'rewards'", naming no env."""
    async def step(self, role, message):
        return {"none": None, "dict": {role: 1.0}}[self.task["give"]]

    result = caller_game("bare", [{"give": "none"}, {"give": "dict"}], 2, tmp_path / "run", step=step)
    assert [e.error for e in result.episodes] == [
        f"TypeError: BareEnv.step returned {kind}, not a StepResult (StepResult() for a turn that pays nothing)"
        for kind in ("NoneType", "dict")]
