"""Every script in benchmarks/ runs with ``--smoke`` (seconds, the tiny model) and prints its JSON.

Benchmarks run by hand only now and then; a change elsewhere that breaks one (a prompt reading a
new observation key, a renamed stat) would otherwise go unnoticed until someone next measures.
The scripts are found by glob, so a new benchmark without ``--smoke`` or without its keys listed
here fails too.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from sandboxes import available_backends

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))  # _*.py: shared helpers
TIMEOUT_S = 240  # a smoke run takes 5-20 s alone; the margin is for a machine busy with other work
# The keys each JSON line must have, as a full run prints them (extra keys are fine; a renamed one is not).
KEYS = {
    "constrained": {"model", "dtype", "roles", "samples_per_role", "max_tokens", "per_role", "valid_free",
                    "valid_constrained", "free_tok_s", "constrained_tok_s", "free_matched_tok_s", "tokens",
                    "throughput_ratio", "end_to_end_ratio", "grammar_s", "constrained_s", "compile_s"},
    "debate": {"model", "dtype", "episodes", "repeats", "batched_s", "one_at_a_time_s", "batched_tok_s",
               "one_at_a_time_tok_s", "speedup"},
    "grpo_vs_trl": {"model", "device", "completions", "new_tokens", "steps", "rolecast_s_per_step", "trl_s_per_step",
                    "rolecast_episodes_s", "trl_episodes_s", "ratio", "rolecast_sampling_s"},
    "joint_passes": {"model", "device", "episodes", "rounds", "autocast_bf16", "population", "team"},
    "logprob_head": {"device", "positions", "chunk", "bf16", "entropy", "frozen_s", "checkpointed_s", "ratio",
                     "max_grad_diff"},
    "pipeline": {"episodes", "messages", "wall_s", "messages_per_s", "bare_validate_per_s", "validation_share"},
    "populations": {"model", "seeds", "steps", "train_episodes", "probe_games", "per_seed", "self_play_exploitability",
                    "population_exploitability", "best_member_exploitability", "goal_met", "cost_ratio",
                    "step_cost_ratio"},
    "prefix_cache": {"model", "dtype", "episodes", "rounds", "cached", "unshared", "uncached", "same_turns", "speedup",
                     "prefill_tokens_ratio", "sharing_speedup", "sharing_prefill_tokens_ratio"},
    "prefix_tree": {"model", "device", "episodes", "rounds", "autocast_bf16", "rps", "guess_number"},
    "rollout": {"model", "dtype", "requests", "max_tokens", "sequential_prompts", "rounds", "engine_tok_s",
                "sequential_tok_s", "ratio", "prefill_tok_s", "decode_path", "decode_tok_s", "decode_rows_per_step",
                "decode_vs_prefill", "transformers_decode_tok_s", "fused_vs_transformers", "fallback_path",
                "fallback_decode_tok_s", "fused_vs_fallback", "engine_vs_prefill",
                "one_adapter_tok_s", "mixed_adapter_tok_s", "mixed_adapter_ratio"},
    "scale": {"model", "recipe", "steps", "episodes_per_step", "device", "cpus", "episodes_per_s", "ratio_to_single"},
    "sandbox": {"sandbox_s", "bare_s", "ratio", "backend", "runs", "stat"},
    "stop_strings": {"model", "dtype", "requests", "max_tokens", "stops", "rounds", "plain_tok_s", "stop_tok_s", "ratio",
                     "same_tokens"},
    "teacher_student": {"model", "episodes_per_domain", "student_temperature", "per_domain"},
    "train": {"model", "device", "batch", "length", "client_tok_s", "plain_tok_s", "ratio", "client_peak_mb", "plain_peak_mb"},
}


def skip_reason(script: Path) -> str | None:
    if script.stem == "sandbox" and not available_backends():
        return "no isolating sandbox backend here (bwrap or unshare as root)"
    if script.stem == "scale" and importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install 'rolecast[ray]')"
    if script.stem == "grpo_vs_trl" and importlib.util.find_spec("trl") is None:
        return "TRL is not installed (pip install 'rolecast[bench]')"
    return None


def smoke(script: Path) -> subprocess.CompletedProcess[str]:
    # One torch thread each: two runs share the two cores, and torch threads that outnumber the
    # cores spin-wait for each other (a tiny model's decode steps turn 10x slower).
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), "--smoke"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> Iterator[dict[Path, Future]]:
    """The selected benchmarks' smoke runs, started together and run two at a time: most of each
    run is importing torch on one core, so this halves the file's wall time."""
    selected = [item.callspec.params["script"] for item in request.session.items
                if item.module is request.module and item.originalname == "test_smoke_run_prints_its_json_line"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {script: pool.submit(smoke, script) for script in selected if skip_reason(script) is None}


def numbers(value: object) -> Iterator[float]:
    if isinstance(value, dict):
        for v in value.values():
            yield from numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from numbers(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


# Keys of rates and ratios, at any depth: a side that measured nothing (no tokens, no episodes)
# would read 0 there and still pass for a run.
RATE = re.compile(r"(^|_)(ratio|speedup)($|_)|_vs_|tok_s$|per_s$|episodes_s$|_share$")


def rates(value: object, named: bool = False) -> Iterator[float]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from rates(v, named or bool(RATE.search(k)))
    elif isinstance(value, list):
        for v in value:
            yield from rates(v, named)
    elif named:
        yield from numbers(value)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_smoke_run_prints_its_json_line(script: Path, runs: dict[Path, Future]) -> None:
    if reason := skip_reason(script):
        pytest.skip(reason)
    proc = runs[script].result()
    assert proc.returncode == 0, f"{script.name} --smoke exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"{script.name} --smoke printed {len(lines)} lines on stdout, not its JSON line alone:\n{proc.stdout[-4000:]}"
    out = json.loads(lines[-1])
    assert isinstance(out, dict) and out, lines[-1]
    expected = KEYS.get(script.stem)
    assert expected is not None, f"list the keys of {script.name}'s JSON line in KEYS"
    assert not expected - out.keys(), f"missing keys {sorted(expected - out.keys())} in {lines[-1]}"
    assert all(math.isfinite(x) for x in numbers(out)), lines[-1]
    assert all(x > 0 for x in rates(out)), lines[-1]


def test_a_failed_episode_stops_a_benchmark(monkeypatch, tmp_path):
    """run_team only logs an episode that fails: debate.py, prefix_cache.py, prefix_tree.py and
    joint_passes.py timed such runs and exited 0, so a prompt broken by a renamed observation key
    still passed their smoke runs."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from _recipes import RECIPES, run_recipe

    from orchestrator.envs.debate import DebateEnv
    from orchestrator.models import load_model
    from orchestrator.team import load_team

    def observe(self, role):
        raise KeyError("topic")

    monkeypatch.setattr(DebateEnv, "observe", observe)
    with pytest.raises(SystemExit, match="debate: 2 of 2 episodes failed: KeyError: 'topic'"):
        run_recipe(load_team(RECIPES / "debate.yaml"), load_model("tiny", dtype="float32"), 2, tmp_path)


def test_populations_stops_on_probe_games_that_measured_nothing(monkeypatch, tmp_path):
    """populations.py counted the moves of failed probe games as none: an empty count made a
    distribution of zeros, exploitability 0, the best score there is, for an adapter never measured."""
    import argparse

    from support import lora_state, peft_dir

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from populations import move_distributions

    from orchestrator.envs.rps import RPSEnv
    from orchestrator.models import load_model

    def observe(self, role):
        raise KeyError("history")

    adapter = peft_dir(tmp_path / "player", lora_state(load_model("tiny", dtype="float32").model, 0, std=0.0))
    monkeypatch.setattr(RPSEnv, "observe", observe)
    with pytest.raises(SystemExit, match="probe games: 2 of 2 failed: KeyError: 'history'"):
        move_distributions({"player": adapter}, argparse.Namespace(model="tiny", probe=2), tmp_path / "probe")


def test_prefix_tree_reports_the_tokens_its_passes_compute(monkeypatch, capsys):
    """prefix_tree.py's ``tree_tokens`` was one tree over the whole step, folded at the CPU's 32
    tokens: with a GPU's pass_tokens (4,096) 4 RPS episodes of the tiny model read 1,730 tokens
    where the passes computed 3,288, and a step cut into micro-batches computes a tree for each."""
    import functools

    from orchestrator.training import LoraConfig, ServiceClient, prefix_tree
    from orchestrator.training.types import Datum, ModelInput

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("prefix_tree")
    seqs = [list(range(100, 160)) + [300 + i] * (4 + i) for i in range(8)]  # a 60-token opening, then apart
    data = [Datum(ModelInput.from_ints(s[:-1]), {"target_tokens": s[1:], "mask": [1.0] * (len(s) - 1),
                                                 "logprobs": [-1.0] * (len(s) - 1), "advantages": [0.5] * (len(s) - 1)})
            for s in seqs]
    service_client = functools.partial(ServiceClient, pass_tokens=4096, micro_batch_tokens=100)  # a GPU's; 2 passes
    computed = []
    hidden_states = prefix_tree.hidden_states
    monkeypatch.setattr(prefix_tree, "hidden_states", lambda body, tree, *a: computed.append(tree.tokens) or hidden_states(body, tree, *a))
    service = service_client("tiny")
    service.create_lora_training_client("bench", LoraConfig(rank=16)).forward_backward(data, "ppo", {}).result()
    service.close()
    expected = sum(computed)
    assert len(computed) == 2

    monkeypatch.setattr(bench, "step_datums", lambda *_: data)
    monkeypatch.setattr(bench, "ServiceClient", service_client)
    monkeypatch.setattr(bench, "kernels", lambda *_: 0)  # seconds, and not what is checked
    monkeypatch.setattr(sys, "argv", ["prefix_tree.py", "--smoke"])
    bench.main()
    report = json.loads(capsys.readouterr().out)
    assert report["rps"]["tree_tokens"] == report["guess_number"]["tree_tokens"] == expected


@pytest.mark.parametrize("name, argv", [("grpo_vs_trl", ["--warmup", "-1", "--generations", "1"]),
                                        ("grpo_vs_trl", ["--trl-micro-batch", "-1", "--generations", "1"]),
                                        ("logprob_head", ["--chunk", "-1", "--smoke"])])
def test_counts_that_may_be_zero_refuse_negatives(name, argv, monkeypatch, capsys):
    """``--warmup -1`` ran a step fewer and timed the cold first one as the run's; ``--chunk -1``
    was a shape-mismatch traceback. (``--generations 1`` stops grpo_vs_trl before it runs anything.)"""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(sys, "argv", [name, *argv])
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(name).main()
    assert stop.value.code == 2 and f"argument {argv[0]}: must be at least 0, got -1" in capsys.readouterr().err


def test_rollout_takes_random_weights_of_a_model_folder(tmp_path):
    """``rollout.py --random-weights`` (how the GPU runs get SmolLM2's shape without carrying its
    weights) on a folder holding the tiny model's config and tokenizer."""
    from orchestrator.models import load_model

    loaded = load_model("tiny", dtype="float32")
    loaded.model.config.save_pretrained(tmp_path)
    loaded.tokenizer.save_pretrained(tmp_path)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/rollout.py"), "--smoke", "--random-weights",
                           "--model", str(tmp_path)], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model"] == str(tmp_path) and out["engine_tok_s"] > 0 and out["sequential_tok_s"] > 0


def test_the_device_script_records_each_stage(tmp_path):
    """benchmarks/device/check.sh, the GPU checks prepared for a lent machine's few minutes
    (docs/gpu.md), dry-run on the CPU: the tests' summary and the learning run's curve reach
    results.jsonl with their exit codes (two variants of two seeds each, side by side), the held-out games by
    secret reach the log; an unknown stage is refused."""
    from orchestrator.models import cache_dir

    work, carry, out = tmp_path / "work", tmp_path / "carry", tmp_path / "out"
    (work / "site").mkdir(parents=True)
    carry.mkdir()
    (work / "rc").mkdir()
    (work / "rc" / "smollm2-135m").symlink_to(cache_dir())  # the tokenizer the tiny model uses
    env = {**os.environ, "PY": sys.executable, "DEVICE": "cpu", "WORK": str(work), "CARRY": str(carry), "OUT": str(out),
           "OMP_NUM_THREADS": "1", "LEARN_S": "600", "LEARN_SEEDS": "0 1", "LEARN_VARIANTS": "=;wide=--set group_size=3",
           "LEARN_ARGS": "--model tiny --steps 2 --set group_size=2 --set groups_per_step=1 --set eval_episodes=2"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/device/check.sh"), "tests", "learn", "nonsense"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 2 and "unknown stage nonsense" in (out / "log.txt").read_text()
    tests, learn = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert tests["stage"] == "tests" and tests["rc"] == 0 and "skipped" in tests["result"]  # no CUDA here
    assert learn["stage"] == "learn" and learn["rc"] == 0, (out / "log.txt").read_text()[-3000:]
    runs = learn["result"]["runs"]
    assert learn["result"]["device"] == "cpu" and sorted(runs) == ["seed0", "seed1", "wide-seed0", "wide-seed1"]
    games = next(json.loads(line)["games"] for line in (out / "log.txt").read_text().splitlines() if line.startswith('{"games"'))
    for label, run in runs.items():
        curve = run["held_out"]
        assert run["steps"] == 2 and sorted(curve) == ["0", "2"]
        assert all(0 <= reward <= 1 and ci >= 0 for reward, ci, _ in curve.values()) and curve["2"][2] > curve["0"][2] == 0
        metrics = [json.loads(line) for line in (out / f"learn-metrics-{label}.jsonl").read_text().splitlines()]
        assert [row["kind"] for row in metrics].count("eval") == 2
        assert metrics[1]["episodes"] == (3 if label.startswith("wide") else 2)  # the variant's own options apply
        assert sorted(games[label]) == ["0", "2"] and all(by_secret and set(by_secret) <= {"3", "6", "11", "14"}
                                                          for by_secret in games[label].values())
        for found, played, common in (row for by_secret in games[label].values() for row in by_secret.values()):
            assert 0 <= found <= played and sum(n for _, n in common) <= played and all(len(g.split()) <= 5 for g, _ in common)
        # the first evaluation at or above the 0.59, with its training minutes; None if none was
        first = next(([int(step), row[2]] for step, row in sorted(curve.items(), key=lambda kv: int(kv[0])) if row[0] >= 0.59), None)
        assert learn["result"]["reached_0.59"][label] == first


def test_device_check_records_a_stage_that_could_not_start(tmp_path):
    """A `weights` stage without its inputs stopped the call with no line in results.jsonl, though
    the script says a failed stage is recorded."""
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "site").mkdir(parents=True)
    env = {**os.environ, "PY": sys.executable, "DEVICE": "cpu", "WORK": str(work), "CARRY": str(tmp_path), "OUT": str(out)}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/device/check.sh"), "weights"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    (line,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert line["stage"] == "weights" and line["rc"] is None and "weights needs" in line["result"]


@pytest.mark.parametrize("flags", [["--population-set", "trainer_config.init_nois=0.3"],
                                   ["--set", "trainer_config.sampling=win_rate"]])
def test_populations_checks_each_runs_options_before_either_trains(flags, monkeypatch):
    """A --population-set its recipe refuses (a misspelt key), or a --set that self-play takes and
    the population does not, stopped the benchmark only at the population's run, once self-play's
    had trained: half an hour a seed at the default 20 steps on this CPU."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    populations = importlib.import_module("populations")
    trained = []
    monkeypatch.setattr(populations, "train", lambda recipe, *_: trained.append(recipe.name))
    monkeypatch.setattr(sys, "argv", ["populations.py", *flags])
    with pytest.raises(SystemExit, match=r"^rps_population\.yaml: --set: trainer_config"):
        populations.main()
    assert trained == []
