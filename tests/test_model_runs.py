"""Runs through the model engine: the tiny random model by default, the real SmolLM2 with -m slow."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def model_attempts(run_dir: Path) -> tuple[list[dict], list[dict]]:
    episodes = [json.loads(line) for line in (run_dir / "transcripts.jsonl").read_text().splitlines()]
    attempts = [a for e in episodes for t in e["turns"] for a in t["attempts"]]
    return episodes, attempts


def assert_tokens_and_logprobs(attempts: list[dict]) -> None:
    assert attempts
    for a in attempts:
        assert a["prompt_ids"] and all(isinstance(i, int) for i in a["prompt_ids"])
        assert a["token_ids"], a
        assert len(a["logprobs"]) == len(a["token_ids"])
        assert all(math.isfinite(x) and x <= 1e-4 for x in a["logprobs"])
        assert a["finish_reason"] in ("stop", "eos", "length")
        assert a["adapter_version"] == 0  # nothing trained yet: the base model


def run_json(cli, recipe, out, *args) -> dict:
    """``rolecast run RECIPE --json`` into ``out`` (RECIPE relative to the repo, or absolute): its summary."""
    code, stdout, err = cli("run", ROOT / recipe, *args, "--out", out, "--no-progress", "--json")
    assert code == 0, err
    return json.loads(stdout.strip().splitlines()[-1])


def test_tiny_model_debate_runs_and_records_tokens(tmp_path, cli):
    summary = run_json(cli, "recipes/debate.yaml", tmp_path, "--model", "tiny", "--episodes", "2", "--dtype", "float32")
    assert summary["status"] == {"ok": 2}
    episodes, attempts = model_attempts(tmp_path)
    assert_tokens_and_logprobs(attempts)
    turns = [t for e in episodes for t in e["turns"]]
    for e in episodes:  # transcripts come in the order episodes finish; each says who opened
        first, second = (("pro", "con") if e["outcome"]["first"] == "pro" else ("con", "pro"))
        assert [t["role"] for t in e["turns"]] == [first, second, first, second, "judge"]
    # random weights write garbage, but constrained decoding (the default) keeps every message valid
    assert summary["valid_turn_rate"] == 1.0 and all(t["retries"] == 0 for t in turns)
    assert all(a["json_schema"] and json.loads(a["text"]) for a in attempts)
    assert summary["generated_tokens"] == sum(len(a["token_ids"]) for a in attempts)


def test_tiny_model_with_free_decoding_is_retried_and_penalised(tmp_path, cli):
    recipe = (ROOT / "recipes/debate.yaml").read_text()
    recipe = recipe.replace("  - use: debater\n", "  - use: debater\n    decoding: free\n").replace(
        "  - use: judge\n", "  - use: judge\n    decoding: free\n").replace("rounds: 2", "rounds: 1")
    (tmp_path / "debate.yaml").write_text(recipe)
    run_json(cli, tmp_path / "debate.yaml", tmp_path / "run", "--model", "tiny", "--episodes", "1", "--dtype", "float32")
    episodes, attempts = model_attempts(tmp_path / "run")
    assert_tokens_and_logprobs(attempts)
    assert all(a["json_schema"] is None for a in attempts)
    # random weights mostly write garbage: those turns are retried, penalised, and the debate still ends
    turns = [t for e in episodes for t in e["turns"]]
    invalid = [t for t in turns if not t["valid"]]
    assert len(invalid) >= len(turns) // 2
    assert all(t["retries"] == 2 and t["penalty"] == -1.0 and len(t["attempts"]) == 3 for t in invalid)


def test_unknown_model_is_a_one_line_error(cli):
    code, _, err = cli("run", ROOT / "recipes/debate.yaml", "--model", "no-such-model", "--no-progress")
    assert code == 2 and "unknown model 'no-such-model'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.ci
def test_default_model_debate_eight_episodes(tmp_path, cli):
    summary = run_json(cli, "recipes/debate.yaml", tmp_path, "--episodes", "8")
    assert summary["episodes"] == 8 and summary["status"] == {"ok": 8}
    episodes, attempts = model_attempts(tmp_path)
    assert len(episodes) == 8
    assert_tokens_and_logprobs(attempts)
    # constrained decoding (the default): every message valid, turn after turn
    assert summary["valid_turn_rate"] >= 0.99, summary


@pytest.mark.slow
@pytest.mark.ci
def test_default_model_sampling_logprobs_match_teacher_forcing():
    """The real model, fp32: the engine's recorded logprobs are what training recomputes."""
    import asyncio

    from orchestrator.engines.base import GenerationRequest, SamplingParams
    from orchestrator.engines.hf import HFEngine
    from orchestrator.models import load_model

    engine = HFEngine(load_model("smollm2-135m", dtype="float32"))
    chats = [[{"role": "user", "content": f"Name {n} animals that live in the sea."}] for n in ("two", "three", "four")]
    reqs = [GenerationRequest(tuple(engine.apply_chat_template(c)), SamplingParams(temperature=0.7, max_tokens=24, seed=i))
            for i, c in enumerate(chats)]

    async def go():
        try:
            return await asyncio.gather(*(engine.generate(r) for r in reqs))
        finally:
            await engine.aclose()

    for req, out in zip(reqs, asyncio.run(go())):
        ref = engine.teacher_forced_logprobs(list(req.prompt_ids), out.token_ids, None, 0.7)
        assert max(abs(a - b) for a, b in zip(ref, out.logprobs)) < 1e-3


@pytest.mark.slow
@pytest.mark.ci
def test_default_model_guess_number_keeps_its_conversation(tmp_path, cli):
    summary = run_json(cli, "recipes/guess_number.yaml", tmp_path, "--episodes", "8")
    assert summary["status"] == {"ok": 8} and summary["valid_turn_rate"] == 1.0
    episodes, attempts = model_attempts(tmp_path)
    assert_tokens_and_logprobs(attempts)
    assert all(1 <= json.loads(a["text"])["guess"] <= 16 for a in attempts)  # the recipe's schema range
    for e in episodes:  # every later turn continues the one before, token for token
        mine = [a for t in e["turns"] for a in t["attempts"]]
        for before, after in zip(mine, mine[1:]):
            assert after["prompt_ids"][: len(before["prompt_ids"]) + len(before["token_ids"])] == \
                before["prompt_ids"] + before["token_ids"]


@pytest.mark.slow
def test_default_model_fixes_an_issue_end_to_end(tmp_path, cli):
    summary = run_json(cli, "recipes/issue_fix.yaml", tmp_path, "--task", ROOT / "tasks/001-slugify-unicode", "--episodes", "1")
    assert summary["status"] == {"ok": 1}
    (episode,), attempts = model_attempts(tmp_path)
    assert_tokens_and_logprobs(attempts)
    assert {t["role"] for t in episode["turns"]} >= {"planner", "coder", "reviewer", "tester"}
    assert 0.0 <= episode["outcome"]["outcome"] <= 1.0 and episode["outcome"]["hidden_total"] > 0
