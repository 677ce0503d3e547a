"""Whole runs through the orchestrator with replay, Python and stub policies (no model)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jinja2
import pytest
from support import Killed, killed_writing, no_engine, write
from orchestrator.cli import build_parser
from orchestrator.config import SamplingConfig
from orchestrator.engines.base import Completion, GenerationRequest, RequestRefused, SamplingParams
from orchestrator.errors import RolecastError
from orchestrator.policies.base import PolicyOutput, PolicyRequest
from orchestrator.policies.binding import Binding
from orchestrator.policies.engine import EnginePolicy
from orchestrator.policies.python import PythonPolicy
from orchestrator.policies.replay import ReplayPolicy
from orchestrator.rollout import RunOptions, build_policies, run_team
from orchestrator.team import load_team
from orchestrator.transcript import MAX_ERROR_CHARS, Attempt, EpisodeRecord, Turn, error_text

ROOT = Path(__file__).resolve().parent.parent
TIME_FIELDS = ("created", "duration_s")


def strip_times(value):
    if isinstance(value, dict):
        return {k: strip_times(v) for k, v in value.items() if k not in TIME_FIELDS}
    if isinstance(value, list):
        return [strip_times(v) for v in value]
    return value


def read_transcripts(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "transcripts.jsonl").read_text().splitlines()]
    return sorted(lines, key=lambda e: e["index"])


def debate_replay(path: Path, winner: str = "for") -> Path:
    lines = [
        {"role": "pro", "text": '{"argument": "It helps."}'},
        {"role": "con", "text": 'Well... ```json\n{"argument": "It hurts."}\n```'},
        {"role": "pro", "text": '{"argument": "Evidence says so."}'},
        {"role": "con", "text": '{"argument": "No it does not."}'},
        {"role": "judge", "text": json.dumps({"winner": winner, "reason": "clearer"})},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_replay_runs_are_deterministic(tmp_path, cli):
    replay = debate_replay(tmp_path / "debate.jsonl")
    args = ["run", ROOT / "recipes/debate.yaml", "--episodes", "6", "--concurrency", "3", "--no-progress"]
    for role in ("pro", "con", "judge"):
        args += ["--policy", f"{role}=replay:{replay}"]
    outs = []
    for name in ("a", "b"):
        code, out, err = cli(*args, "--out", tmp_path / name)
        assert code == 0, err
        outs.append(strip_times(read_transcripts(tmp_path / name)))
    assert outs[0] == outs[1]
    first = outs[0][0]
    assert [t["role"] for t in first["turns"]] == ["pro", "con", "pro", "con", "judge"]
    assert first["rewards"] == {"pro": 1.0, "con": -0.5, "judge": 0.0}
    assert first["outcome"] == {"winner": "pro", "first": "pro", "labels": {"A": "con", "B": "pro"}}  # the judge's sides
    assert first["turns"][1]["content"] == {"argument": "It hurts."}  # fenced reply parsed
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == {"ok": 6} and summary["roles"]["pro"]["mean_reward"] == 1.0


def garbage(request):
    return "I am a model and I refuse to write JSON :)"


def test_garbage_policy_is_retried_penalised_and_recorded(tmp_path):
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    policies["con"] = PythonPolicy(garbage)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=2, seed=1, out_dir=tmp_path, progress=False)))
    assert [e.status for e in result.episodes] == ["ok", "ok"]
    con_turns = [t for t in result.episodes[0].turns if t.role == "con"]
    assert len(con_turns) == 2  # on_invalid: continue, the debate went on
    turn = con_turns[0]
    assert not turn.valid and turn.retries == 2 and len(turn.attempts) == 3
    assert turn.penalty == -1.0
    assert "no JSON object" in turn.attempts[0].errors[0]
    # the retry shows the model its own reply and the validator's message
    retry = turn.attempts[1].messages
    assert retry[-2] == {"role": "assistant", "content": garbage(None)}
    assert "no JSON object" in retry[-1]["content"]
    assert result.episodes[0].rewards["con"] == 2 * -1.0 + 0.0  # two penalties; stub judge names no winner
    assert result.summary["roles"]["con"]["invalid_turns"] == 4
    saved = read_transcripts(tmp_path)
    assert saved[0]["turns"][1]["penalty"] == -1.0 and saved[0]["turns"][1]["retries"] == 2


def test_a_retry_extends_the_attempt_it_retries(tmp_path):
    """A model policy continues the tokens of the attempt a retry answers (its sampled reply, not its
    text re-tokenised, and one sequence in training): without it, the retry was re-rendered."""
    team = load_team(ROOT / "recipes/debate.yaml")
    requests = []

    def con(request):
        requests.append(request)
        return garbage(request) if request.attempt == 0 else '{"argument": "y"}'

    policies = build_policies(team, stub_all(team), no_engine)
    policies["con"] = PythonPolicy(con)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    turn = next(t for t in result.episodes[0].turns if t.role == "con")
    assert (turn.valid, turn.retries) == (True, 1)
    assert requests[0].extends is None and requests[1].extends is turn.attempts[0]


def test_a_fault_with_a_huge_message_is_recorded_cut_short(tmp_path):
    """A repo copy failing on every file of a big repo (shutil.Error lists them all) put its whole
    message, megabytes, into the transcript line and the log's warning."""
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)

    def broken(request):
        raise OSError("cannot copy " + "a/file.py, " * 100_000)

    policies["con"] = PythonPolicy(broken)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    (episode,) = read_transcripts(tmp_path)
    assert episode["status"] == "error" and episode["error"].startswith("OSError: cannot copy a/file.py, ")
    assert len(episode["error"]) < 2100 and episode["error"].endswith(" more characters)")
    assert result.episodes[0].error == episode["error"]


def test_an_error_of_max_error_chars_is_kept_whole_and_one_more_is_cut():
    whole = OSError("x" * (MAX_ERROR_CHARS - len("OSError: ")))
    assert error_text(whole) == f"OSError: {whole}"
    assert error_text(OSError(f"{whole}y")) == f"OSError: {whole}... (1 more characters)"


def test_an_episode_record_reads_back_whole_and_an_older_one_counts_every_role():
    attempt = Attempt([{"role": "user", "content": "go"}], "hi", True, [], prompt_ids=[1], token_ids=[2], logprobs=[-0.5])
    record = EpisodeRecord(id="e1", index=3, team="t", task={"text": "x"}, seed=1, adapters={"con": "pro@2"},
                           status="timeout", turns=[Turn(0, "pro", "m0", {"say": "hi"}, True, 0, 0.0, attempts=[attempt])],
                           rewards={"pro": 0.0, "con": 0.0}, took_part=["pro"], outcome={"winner": None})
    again = EpisodeRecord.loads(record.dumps())
    assert again == record
    assert again.failed and again.in_episode("pro") and not again.in_episode("con")
    assert dataclasses.replace(again, took_part=None).in_episode("con")  # a transcript from before took_part


def test_a_turn_valid_on_its_retry_costs_no_penalty(tmp_path):
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    policies["con"] = PythonPolicy(lambda r: garbage(r) if r.attempt == 0 else '{"argument": "It hurts."}')
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    con_turns = [t for t in result.episodes[0].turns if t.role == "con"]
    assert [(t.valid, t.retries, t.penalty) for t in con_turns] == [(True, 1, 0.0)] * 2
    assert result.episodes[0].rewards["con"] == 0.0  # no penalty; the stub judge names no winner


def test_each_try_samples_with_a_seed_of_its_own(tmp_path):
    # a retry on its first try's seed: a seeded engine samples the refused reply again, every time;
    # and so does every episode and every run seed (a group of episodes sampling alike learns nothing)
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    seeds = []
    policies["con"] = PythonPolicy(lambda r: seeds.append(r.seed) or garbage(r))
    for run_seed in (1, 2):
        asyncio.run(run_team(team, policies, RunOptions(episodes=2, seed=run_seed, out_dir=tmp_path / str(run_seed),
                                                        progress=False)))
    assert len(seeds) == len(set(seeds)) == 2 * 2 * 6  # runs of two episodes, each two turns of three tries


def test_a_policy_is_asked_with_its_roles_reply_prefix_and_schema(tmp_path):
    team = load_team(ROOT / "recipes/guess_number.yaml")
    spec = team.roles["guesser"]
    asked = []
    policies = {"guesser": PythonPolicy(lambda r: asked.append((r.reply_prefix, r.json_schema)) or '{"guess": 50}')}
    asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    assert spec.config.reply_prefix and spec.json_schema
    assert asked and set(asked) == {(spec.config.reply_prefix, spec.json_schema)}


def test_an_attempt_records_what_its_policy_says_of_its_sampling(tmp_path):
    # training replays a constrained reply's masks from these: the schema, the prefix its grammar
    # started after (none where the tokens were sampled free), the tokens forced and the spellings
    team = load_team(ROOT / "recipes/guess_number.yaml")
    spec = team.roles["guesser"]

    def guess(r):
        constrained = r.attempt == 0
        return PolicyOutput(text=garbage(r) if constrained else '{"guess": 50}', token_ids=[1, 2], logprobs=[-0.5, -0.25],
                            finish_reason="stop", adapter="a", adapter_version=3, forced_tokens=int(constrained),
                            json_schema=r.json_schema if constrained else None, spelled=constrained, completion_tokens=9)

    result = asyncio.run(run_team(team, {"guesser": PythonPolicy(guess)},
                                  RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    first, retry = result.episodes[0].turns[0].attempts
    assert (first.json_schema, first.reply_prefix, first.forced_tokens, first.spelled) == \
        (spec.json_schema, spec.config.reply_prefix, 1, True) and spec.config.reply_prefix
    assert (retry.json_schema, retry.reply_prefix, retry.forced_tokens, retry.spelled) == (None, "", 0, False)
    assert (retry.token_ids, retry.logprobs, retry.finish_reason, retry.adapter, retry.adapter_version,
            retry.completion_tokens) == ([1, 2], [-0.5, -0.25], "stop", "a", 3, 9)
    assert retry.duration_s > 0


class FakeEngine:
    """Encodes a character as its code point; records what it is asked to generate."""

    def __init__(self, refuse: str = ""):
        self.asked, self.refuse = [], refuse

    def apply_chat_template(self, messages):
        return [ord(c) for m in messages for c in m["content"]]

    def encode(self, text):
        return [ord(c) for c in text]

    async def generate(self, request):
        self.asked.append(request)
        if self.refuse:
            raise RequestRefused(self.refuse)
        return Completion([7, 8], '7}', [-0.5, -0.25], "eos", adapter="a", adapter_version=3, forced_tokens=1,
                          spelled=True)


def engine_request(**fields) -> PolicyRequest:
    fields = {"role": "guesser", "episode": "e", "episode_index": 0, "turn": 2, "attempt": 0, "context": {},
              "messages": [{"role": "user", "content": "hi"}], "adapter": "a", "seed": 11,
              "sampling": SamplingConfig(temperature=0.5, top_p=0.9, max_tokens=9, stop=["\n"]), **fields}
    return PolicyRequest(**fields)


def test_the_engine_policy_samples_after_the_reply_prefix_and_records_it_in_the_reply():
    # the prefix is prompt-side (never sampled) but part of the reply; the grammar starts after it
    # only under a schema; the role's sampling, seed and adapter go to the engine as they are
    engine = FakeEngine()
    out = asyncio.run(EnginePolicy(engine)(engine_request(reply_prefix='{"g": ', json_schema="{}")))
    (asked,) = engine.asked
    assert asked == GenerationRequest(tuple(map(ord, 'hi{"g": ')), SamplingParams(0.5, 0.9, 9, ("\n",), 11), "a",
                                      json_schema="{}", reply_prefix='{"g": ')
    assert (out.text, out.prompt_ids, out.token_ids, out.logprobs, out.finish_reason) == \
        ('{"g": 7}', list(map(ord, 'hi{"g": ')), [7, 8], [-0.5, -0.25], "eos")
    assert (out.adapter, out.adapter_version, out.json_schema, out.forced_tokens, out.spelled) == ("a", 3, "{}", 1, True)
    asyncio.run(EnginePolicy(engine)(engine_request(reply_prefix='{"g": ')))
    assert engine.asked[1].prompt_ids == asked.prompt_ids and (engine.asked[1].json_schema, engine.asked[1].reply_prefix) == (None, "")


def test_an_engine_refusal_names_the_role_and_turn():
    with pytest.raises(RequestRefused, match="^role 'guesser', turn 2: too long$"):
        asyncio.run(EnginePolicy(FakeEngine(refuse="too long"))(engine_request()))

    def refuse(messages):
        raise jinja2.TemplateError("no")

    engine = FakeEngine()
    engine.apply_chat_template = refuse  # with no system message to leave out, no hint to leave it out
    with pytest.raises(RequestRefused, match="^role 'guesser', turn 2: the model's chat template refuses its messages: no$"):
        asyncio.run(EnginePolicy(engine)(engine_request()))


def test_a_policy_that_returns_no_text_is_a_policy_error(tmp_path):
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    policies["con"] = PythonPolicy(lambda r: None)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    assert result.episodes[0].error == "PolicyError: policy for role 'con' returned NoneType, not text"


def test_an_episodes_own_adapters_are_the_ones_its_roles_sample(tmp_path):
    # a population's or self-play's opponent snapshot, per episode, in place of the role's adapter
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    asked = []
    policies["con"] = PythonPolicy(lambda r: asked.append((r.episode_index, r.adapter)) or '{"argument": "x"}')
    options = RunOptions(episodes=2, seed=1, out_dir=tmp_path, progress=False, concurrency=1,
                         adapters_for=lambda i: {"con": f"snapshot-{i}"} if i else {})
    asyncio.run(run_team(team, policies, options))
    assert sorted(asked) == [(0, "con"), (0, "con"), (1, "snapshot-1"), (1, "snapshot-1")]


def test_a_reply_that_parses_but_stays_invalid_hands_on_no_content(tmp_path):
    # as a reply with no JSON at all: the environment and the transcript get None, the errors stay
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    policies["con"] = PythonPolicy(lambda r: '{"argument": 5}')
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    con_turns = [t for t in result.episodes[0].turns if t.role == "con"]
    assert [(t.valid, t.content) for t in con_turns] == [(False, None)] * 2
    assert con_turns[0].attempts[-1].errors == ['at $.argument: 5 is not of type "string"']


def test_the_environment_gets_the_last_tries_reply_its_errors_and_the_recipients(tmp_path):
    # the Message an env's step reads: a turn invalid after its retries is its last try, not its first
    team = load_team(ROOT / "recipes/debate.yaml")
    given = []

    class Recording(team.env_class):
        async def step(self, role, message):
            given.append(message)
            return await super().step(role, message)

    team = dataclasses.replace(team, env_class=Recording)
    policies = build_policies(team, stub_all(team), no_engine)
    policies["con"] = PythonPolicy(lambda r: garbage(r) if r.attempt == 0 else '{"argument": 5}')
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    (episode,) = result.episodes
    message = given[1]
    assert (message.id, message.turn, message.sender, message.recipients) == (f"{episode.id}:1", 1, "con", ["pro", "judge"])
    assert (message.valid, message.content, message.raw) == (False, None, '{"argument": 5}')
    assert message.errors == ['at $.argument: 5 is not of type "string"']
    assert given[0].recipients == ["con", "judge"] and given[0].valid and given[0].errors == []


def test_an_episode_ends_at_the_step_that_says_done(tmp_path):
    # done ends the episode whoever next_role would name (a resignation, a solved task)
    team = load_team(ROOT / "recipes/debate.yaml")

    class Resigning(team.env_class):
        async def step(self, role, message):
            return dataclasses.replace(await super().step(role, message), done=True)

    team = dataclasses.replace(team, env_class=Resigning)
    policies = build_policies(team, stub_all(team), no_engine)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    (episode,) = result.episodes
    assert (episode.status, [t.role for t in episode.turns]) == ("ok", ["pro"])


def test_an_episode_stops_at_max_turns_without_a_result(tmp_path):
    team = load_team(ROOT / "recipes/debate.yaml")  # two rounds: the verdict is the fifth turn
    team = dataclasses.replace(team, config=team.config.model_copy(update={"max_turns": 3}))
    policies = build_policies(team, stub_all(team), no_engine)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=1, out_dir=tmp_path, progress=False)))
    (episode,) = result.episodes
    assert (episode.status, len(episode.turns), episode.outcome["winner"]) == ("max_turns", 3, None)


def test_a_reply_with_a_lone_surrogate_is_written_and_read_back(tmp_path):
    # a Python policy's text (os.fsdecode of a file name) or a server's "\\udcff": no UTF-8 holds it
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    policies["con"] = PythonPolicy(lambda r: 'file \udcff: {"argument": "x"}')
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=0, out_dir=tmp_path, progress=False)))
    assert result.episodes[0].status == "ok"
    assert read_transcripts(tmp_path)[0]["turns"][1]["attempts"][0]["text"] == 'file \udcff: {"argument": "x"}'


def test_a_kill_while_config_yaml_is_written_leaves_no_half_config(tmp_path, monkeypatch):
    # a half config.yaml made the dir a run's (--out refused it) that no command could read
    from orchestrator.launch import recorded_run, run_dir

    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    killed_writing(monkeypatch, "config.yaml")
    with pytest.raises(Killed):
        asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=0, out_dir=tmp_path / "run", progress=False)))
    monkeypatch.undo()
    assert recorded_run(tmp_path / "run") is None and run_dir(tmp_path / "run", "debate", fresh=True)


def test_a_run_builds_only_the_episodes_in_flight_and_can_leave_them_on_disk(tmp_path):
    # every episode's record (and task) was built before the first was played, and every played one
    # kept: 2,000,000 episodes held 14 GB
    team = load_team(ROOT / "recipes/debate.yaml")
    built, seen = [], []

    async def pro(request):  # it yields, as a model's does: the other episodes go on meanwhile
        await asyncio.sleep(0)
        seen.append(len(built))
        return '{"argument": "x"}'

    results = []
    for keep in (True, False):
        built.clear()
        policies = build_policies(team, stub_all(team), no_engine)
        policies["pro"] = PythonPolicy(pro)
        options = RunOptions(episodes=60, seed=3, out_dir=tmp_path / str(keep), concurrency=4, progress=False,
                             adapters_for=lambda i: built.append(i) or {}, keep_episodes=keep)
        results.append(asyncio.run(run_team(team, policies, options)))
        assert built == list(range(60)) and seen[0] <= 4
    kept, read_back = results
    assert isinstance(kept.episodes, list) and not isinstance(read_back.episodes, list)
    assert [e.index for e in read_back.episodes] == list(range(60)) and read_back.episodes[-1].index == 59
    assert ([strip_times(json.loads(e.dumps())) for e in read_back.episodes[10:20]]
            == [strip_times(json.loads(e.dumps())) for e in kept.episodes[10:20]])
    assert read_back.episodes[0].turns[0].attempts[0].text == '{"argument": "x"}'
    assert strip_times(read_back.summary) == {**strip_times(kept.summary), "run_dir": str(tmp_path / "False"),
                                              "wall_s": read_back.summary["wall_s"],
                                              "messages_per_s": read_back.summary["messages_per_s"],
                                              "generated_tok_s": read_back.summary["generated_tok_s"]}


def test_a_run_of_countless_episodes_holds_only_what_it_played(tmp_path):
    # the transcript offsets were sized to --episodes up front: 10**9 allocated 16 GB before the
    # first episode, and 10**15 was a MemoryError traceback
    team = load_team(ROOT / "recipes/debate.yaml")

    async def play(record):
        if record.index == 3:
            raise Killed  # the user's Ctrl-C, long before the end
        record.status = "ok"
        return record

    options = RunOptions(episodes=10**15, seed=0, out_dir=tmp_path, concurrency=1, progress=False, play=play)
    with pytest.raises(Killed):
        asyncio.run(run_team(team, {}, options))
    assert [r["index"] for r in read_transcripts(tmp_path)] == [0, 1, 2]


def test_a_runs_episodes_read_back_after_a_change_of_directory(tmp_path, monkeypatch):
    # the view kept the run dir's relative path: a notebook's %cd after api.run broke every access
    team = load_team(ROOT / "recipes/debate.yaml")
    monkeypatch.chdir(tmp_path)
    options = RunOptions(episodes=2, seed=0, out_dir=Path("rel"), concurrency=1, progress=False, keep_episodes=False)
    result = asyncio.run(run_team(team, build_policies(team, stub_all(team), no_engine), options))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert [e.index for e in result.episodes] == [0, 1] and result.episodes[1].index == 1


def stub_all(team):
    """Bind every role to the stub; a test then swaps in the policies it is about."""
    return {name: Binding("builtin", "stub") for name in team.roles}


def test_replay_exhaustion_and_policy_crash_end_the_episode_not_the_run(tmp_path):
    team = load_team(ROOT / "recipes/debate.yaml")
    short = tmp_path / "short.jsonl"
    short.write_text('{"role": "pro", "text": "{\\"argument\\": \\"x\\"}"}\n')

    def boom(request):
        raise RuntimeError("policy server down")

    policies = build_policies(team, {**stub_all(team), "pro": Binding("replay", str(short))}, no_engine)
    policies["con"] = PythonPolicy(lambda r: '{"argument": "y"}')
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=0, out_dir=tmp_path / "a", progress=False)))
    ep = result.episodes[0]
    assert ep.status == "error" and "no more lines for role 'pro'" in ep.error
    assert [t.role for t in ep.turns] == ["pro", "con"]  # what happened before is kept

    policies = build_policies(team, stub_all(team), no_engine)
    policies["con"] = PythonPolicy(boom)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=2, seed=0, out_dir=tmp_path / "b", progress=False)))
    assert [e.status for e in result.episodes] == ["error", "error"]
    assert "policy server down" in result.episodes[0].error
    assert len(read_transcripts(tmp_path / "b")) == 2


def test_the_summarys_turn_measures_leave_out_the_episodes_that_failed():
    """A failed episode is counted in `status`; its turns, cut short by the fault, are not in the
    turn counts and rates (a training step's row leaves them out too), only in the throughput."""
    from orchestrator.rollout import summarize
    from support import make_attempt, make_episode

    ran = make_episode(("pro", [make_attempt(token_ids=[1, 2])]), ("con", [make_attempt(token_ids=[3])]), rewards={"pro": 1.0})
    ran.status = "ok"
    broke = make_episode(("pro", [make_attempt(valid=False, token_ids=[4]), make_attempt(valid=False, token_ids=[5])]))
    broke.status = "error"
    summary = summarize(load_team(ROOT / "recipes/debate.yaml"), [ran, broke], 1.0)
    assert summary["status"] == {"ok": 1, "error": 1} and summary["turns"] == 2 and summary["retries"] == 0
    assert summary["valid_turn_rate"] == 1.0 and summary["first_try_valid_rate"] == 1.0
    assert summary["roles"]["pro"] == {"mean_reward": 1.0, "reward_ci95": None, "turns": 1, "invalid_turns": 0, "retries": 0}
    assert summary["generated_tokens"] == 5 and summary["messages_per_s"] == 3.0  # the work done, failed or not


def test_the_summary_counts_retries_invalid_turns_and_rewards_of_the_roles_that_took_part():
    from orchestrator.rollout import summarize
    from support import make_attempt, make_episode

    team = load_team(ROOT / "recipes/debate.yaml")

    class Measured(team.env_class):
        @classmethod
        def outcome_metrics(cls, config, outcomes):
            return {"first": outcomes[0]["i"], "n": len(outcomes)}

    bad = make_attempt(valid=False)
    a = make_episode(("pro", [bad, make_attempt()]), ("con", [bad, bad, bad]), rewards={"pro": 1.0, "con": -1.0, "judge": 0.0},
                     outcome={"i": 1})
    b = make_episode(("pro", [make_attempt()]), rewards={"pro": 3.0, "con": 0.0, "judge": 0.0}, outcome={"i": 0})
    c = make_episode(("con", [make_attempt()]), rewards={"pro": 0.0, "con": 0.5, "judge": 0.0}, outcome={"i": 2})
    for record, index, status, took_part in ((a, 1, "ok", ["pro", "con"]), (b, 0, "ok", ["pro"]), (c, 2, "max_turns", ["con"])):
        record.index, record.status, record.took_part = index, status, took_part
    summary = summarize(dataclasses.replace(team, env_class=Measured), [a, b, c], 1.0)
    assert (summary["turns"], summary["valid_turn_rate"], summary["first_try_valid_rate"], summary["retries"]) == (4, 0.75, 0.5, 3)
    roles = {name: (r["mean_reward"], r["turns"], r["invalid_turns"], r["retries"]) for name, r in summary["roles"].items()}
    assert roles == {"pro": (2.0, 2, 0, 1), "con": (-0.25, 2, 1, 2), "judge": (None, 0, 0, 0)}
    assert summary["env"] == {"first": 0, "n": 2}  # the finished episodes' outcomes, in index order


def test_episodes_play_at_once_and_come_back_in_index_order(tmp_path):
    # episode 0 waits for episode 1 to start: played one at a time, it would run out of time
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    started = asyncio.Event()

    async def pro(r):
        if r.episode_index == 1:
            started.set()
        else:
            await started.wait()
        return '{"argument": "x"}'

    policies["pro"] = PythonPolicy(pro)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=2, seed=1, out_dir=tmp_path, progress=False,
                                                             concurrency=2, episode_timeout_s=5)))
    assert [(e.index, e.status) for e in result.episodes] == [(0, "ok"), (1, "ok")]
    assert [e["index"] for e in map(json.loads, (tmp_path / "transcripts.jsonl").read_text().splitlines())] == [1, 0]


def test_a_replay_plays_an_episode_id_again_from_the_start(tmp_path):
    # a training run's evaluations reuse one seed, so its episode ids, with the same policies
    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, {name: Binding("replay", str(debate_replay(tmp_path / "d.jsonl"))) for name in team.roles},
                              no_engine)
    for name in ("a", "b"):
        result = asyncio.run(run_team(team, policies, RunOptions(episodes=2, seed=0, out_dir=tmp_path / name, progress=False)))
        assert [e.status for e in result.episodes] == ["ok", "ok"], result.episodes[0].error


def test_a_replay_request_reads_its_own_lines_not_the_whole_file(tmp_path, monkeypatch):
    # a file of every episode of a big run: each request scanned every line, O(episodes^2) per run
    import orchestrator.policies.replay as replay

    reads = [0]

    class Line(dict):
        def __getitem__(self, key):
            reads[0] += 1
            return super().__getitem__(key)

        def get(self, key, default=None):
            reads[0] += 1
            return super().get(key, default)

    loaded = replay.load_json_lines
    monkeypatch.setattr(replay, "load_json_lines", lambda path: ((n, Line(v)) for n, v in loaded(path)))
    episodes = 300
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"role": "pro", "episode": e, "text": str(e)}) + "\n" for e in range(episodes))
                    + json.dumps({"role": "pro", "text": "any"}) + "\n")
    policy = replay.ReplayPolicy(path)
    reads[0] = 0

    async def play():
        return [(await policy(PolicyRequest(role="pro", episode=f"x-{e}", episode_index=e, turn=turn, attempt=0,
                                            messages=[], context={}, sampling=None, adapter=None, seed=0))).text
                for e in reversed(range(episodes)) for turn in range(2)]

    assert asyncio.run(play()) == [text for e in reversed(range(episodes)) for text in (str(e), "any")]  # the file's order
    assert reads[0] < 10 * episodes
    # a cursor per episode and role, the least recently used dropped past the bound: they had grown with the run
    monkeypatch.setattr(replay.ReplayPolicy, "MAX_CURSORS", 100)
    asyncio.run(play())
    assert len(policy.cursors) == 100


def test_a_replay_keeps_each_episodes_place_by_its_id_and_drops_the_least_recently_used(tmp_path, monkeypatch):
    """Two episodes of one index at once (a run's evaluation and its training) each play the file
    from the start; past the bound, the cursor dropped is the one least recently used."""
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"role": "pro", "text": str(n)}) + "\n" for n in range(3)))
    policy = ReplayPolicy(path)
    monkeypatch.setattr(ReplayPolicy, "MAX_CURSORS", 2)

    async def play(*turns: tuple[str, int]) -> list[str]:
        return [(await policy(PolicyRequest(role="pro", episode=episode, episode_index=0, turn=turn, attempt=0,
                                            messages=[], context={}, sampling=None, adapter=None, seed=0))).text
                for episode, turn in turns]

    # "a" used last before "c" comes in: "b" is dropped, and "c" too is kept
    assert asyncio.run(play(("a", 0), ("b", 0), ("a", 1), ("c", 0), ("a", 2), ("c", 1))) == ["0", "0", "1", "0", "2", "1"]
    assert list(policy.cursors) == [("a", "pro"), ("c", "pro")]
    # an id played again from any turn up to its last request's starts over, not only from its first turn's
    assert asyncio.run(play(("d", 1), ("d", 3), ("d", 2))) == ["0", "1", "0"]


def test_a_python_policy_awaits_any_awaitable_it_is_given(tmp_path):
    """``fn`` may return a future or task (an awaitable, not a coroutine): it was the reply."""
    async def reply() -> str:
        return "ok"

    policy = PythonPolicy(lambda request: asyncio.ensure_future(reply()))
    assert asyncio.run(policy(None)) == "ok"


def test_episode_timeout_keeps_partial_transcript(tmp_path):
    team = load_team(ROOT / "recipes/debate.yaml")

    async def slow(request):
        if request.role == "con":
            await asyncio.sleep(30)
        return '{"argument": "z"}'

    policies = {name: PythonPolicy(slow) for name in team.roles}
    options = RunOptions(episodes=3, seed=0, out_dir=tmp_path, progress=False, episode_timeout_s=0.3)
    result = asyncio.run(asyncio.wait_for(run_team(team, policies, options), 10))
    assert [e.status for e in result.episodes] == ["timeout"] * 3
    assert [t.role for t in result.episodes[0].turns] == ["pro"]



def test_a_fault_mid_retry_keeps_the_tries_made_before_it(tmp_path):
    # a replay line retried into the file's end, or a retry past the episode's time: the turn was
    # lost whole, so the transcript hid the reply that used the line (or the time) up
    team = load_team(ROOT / "recipes/debate.yaml")
    short = tmp_path / "short.jsonl"
    short.write_text('{"role": "pro", "text": "no JSON here"}\n')

    async def slow_retry(request):
        await asyncio.sleep(30 * request.attempt)
        return "no JSON either"

    policies = build_policies(team, {**stub_all(team), "pro": Binding("replay", str(short))}, no_engine)
    runs = [(policies, 900.0, "error"), ({name: PythonPolicy(slow_retry) for name in team.roles}, 0.3, "timeout")]
    for n, (bound, timeout, status) in enumerate(runs):
        options = RunOptions(episodes=1, seed=0, out_dir=tmp_path / str(n), progress=False, episode_timeout_s=timeout)
        assert asyncio.run(asyncio.wait_for(run_team(team, bound, options), 10)).episodes[0].status == status
        (turn,) = read_transcripts(tmp_path / str(n))[0]["turns"]
        assert [a["text"] for a in turn["attempts"]] == [["no JSON here", "no JSON either"][n]]
        assert (turn["valid"], turn["retries"], turn["penalty"]) == (False, 0, 0.0)  # it never ran out of retries

def test_a_policys_own_timeout_is_an_error_not_the_episodes(tmp_path):
    def api(request):
        raise TimeoutError("the judge's API did not answer in 10s")  # as urlopen(timeout=10) raises it

    team = load_team(ROOT / "recipes/debate.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    policies["judge"] = PythonPolicy(api)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=0, out_dir=tmp_path, progress=False)))
    ep = result.episodes[0]
    assert (ep.status, ep.error) == ("error", "TimeoutError: the judge's API did not answer in 10s")


def test_pipeline_loops_back_until_approved(tmp_path):
    team = load_team(ROOT / "recipes/code_review.yaml")
    verdicts = iter(["request_changes", "request_changes", "approve"])

    def reviewer(request):
        return json.dumps({"verdict": next(verdicts), "comments": ["c"]})

    policies = build_policies(team, stub_all(team), no_engine)
    policies["reviewer"] = PythonPolicy(reviewer)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=0, out_dir=tmp_path, progress=False)))
    ep = result.episodes[0]
    assert [t.role for t in ep.turns] == ["planner", "coder", "reviewer", "coder", "reviewer", "coder", "reviewer"]
    assert ep.outcome == {"rounds": 3, "succeeded": True}
    assert ep.rewards == {"planner": 1.0, "coder": 1.0, "reviewer": 1.0}
    # the Coder's second prompt shows the Reviewer's request
    assert "request_changes" in ep.turns[3].attempts[0].messages[-1]["content"]
    # recipients: the pipeline routes each message to the next role
    assert result.summary["roles"]["reviewer"]["turns"] == 3


def test_a_reply_reaches_the_next_roles_prompt_as_written(tmp_path):
    """The library prompts show the history with `tojson`, which is Jinja's HTML-safe JSON: the
    Coder's `a < b` reached the Reviewer as `a \\u003c b`, its `'`, `&` and `é` as escapes too, and
    its keys sorted."""
    team = load_team(ROOT / "recipes/code_review.yaml")
    reply = {"summary": "compare", "edits": [{"path": "x.py", "search": "", "replace": "return a < b > c & 'café'"}]}
    policies = build_policies(team, stub_all(team), no_engine)
    policies["coder"] = PythonPolicy(lambda r: json.dumps(reply))
    policies["reviewer"] = PythonPolicy(lambda r: '{"verdict": "approve"}')
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=0, out_dir=tmp_path, progress=False)))
    prompt = result.episodes[0].turns[2].attempts[0].messages[-1]["content"]
    assert f"- coder: {json.dumps(reply, ensure_ascii=False)}\n" in prompt


def test_pipeline_stops_at_max_rounds(tmp_path):
    team = load_team(ROOT / "recipes/code_review.yaml")
    policies = build_policies(team, stub_all(team), no_engine)
    policies["reviewer"] = PythonPolicy(lambda r: '{"verdict": "request_changes"}')
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=1, seed=0, out_dir=tmp_path, progress=False)))
    ep = result.episodes[0]
    assert sum(t.role == "reviewer" for t in ep.turns) == 3
    assert ep.outcome["succeeded"] is False and ep.rewards["coder"] == 0.0


def test_pipeline_routes_a_role_that_acts_twice_by_its_position():
    import random

    from orchestrator.envs.pipeline import PipelineConfig, PipelineEnv
    from orchestrator.messages import Message

    env = PipelineEnv(PipelineConfig(order=["planner", "coder", "planner"]), {}, {}, random.Random(0))
    sent = []
    while (role := env.next_role()) is not None:
        sent.append((role, env.recipients(role)))
        asyncio.run(env.step(role, Message(id="e", episode="e", turn=0, sender=role, recipients=[], content={},
                                           raw="{}", valid=True)))
    # the planner's first message goes to the coder, its second (the last turn) back to the start
    assert sent == [("planner", ["coder"]), ("coder", ["planner"]), ("planner", ["planner"])]


def test_pipeline_loops_a_role_back_to_itself():
    """loop_back from and to one role (a reviewer that looks again) is a loop of one turn a round."""
    import random

    from orchestrator.envs.pipeline import PipelineConfig, PipelineEnv
    from orchestrator.messages import Message

    config = PipelineConfig(order=["coder", "reviewer"], max_rounds=3,
                            loop_back={"from": "reviewer", "to": "reviewer", "field": "verdict", "values": ["again"]})
    assert config.turns_needed() == 4
    env = PipelineEnv(config, dict.fromkeys(config.order), {}, random.Random(0))
    played = []
    while (role := env.next_role()) is not None:
        played.append(role)
        asyncio.run(env.step(role, Message(id="e", episode="e", turn=0, sender=role, recipients=[],
                                           content={"verdict": "again"}, raw="", valid=True)))
    assert played == ["coder", "reviewer", "reviewer", "reviewer"] and env.outcome()["rounds"] == 3


def test_pipeline_views_its_rounds_success_and_an_invalid_end():
    """The round and the last message each role sees, the turn each history entry keeps, success
    read from its role's last message (not the pipeline's last), and on_invalid: end."""
    import random

    from orchestrator.envs.pipeline import PipelineConfig, PipelineEnv
    from orchestrator.messages import Message

    config = PipelineConfig(order=["planner", "coder", "reviewer", "tester"],
                            loop_back={"from": "reviewer", "to": "coder", "field": "verdict", "values": ["redo"]},
                            success={"role": "reviewer", "field": "verdict", "values": ["approve"]}, on_invalid="end")
    assert PipelineEnv.reads(config, "reviewer") == {"verdict": ["redo", "approve"]}
    roles = dict.fromkeys(config.order)

    def send(env, content, valid=True):
        turn = len(env.history)
        return asyncio.run(env.step(env.next_role(), Message(id="e", episode="e", turn=turn, sender="x", recipients=[],
                                                             content=content, raw="", valid=valid)))

    env = PipelineEnv(config, roles, {}, random.Random(0))
    for content in ({"plan": 1}, {"code": 1}, {"verdict": "redo"}):
        send(env, content)
    seen = env.observe(env.next_role())
    assert env.next_role() == "coder" and seen["round"] == 2 and seen["last"]["content"] == {"verdict": "redo"}
    assert [h["turn"] for h in seen["history"]] == [0, 1, 2]
    send(env, {"code": 2})
    send(env, {"verdict": "approve"})
    result = send(env, {"tests": "fail"})
    assert result.done and env.succeeded is True and result.rewards == dict.fromkeys(roles, 1.0)

    env = PipelineEnv(config, roles, {}, random.Random(0))
    result = send(env, None, valid=False)
    assert result.done and env.next_role() is None and env.succeeded is False and result.rewards["coder"] == 0.0


def test_pipeline_takes_any_listed_value_pays_failure_reward_and_goes_on_past_an_invalid_turn():
    """Any of a match's values fires it (not its first only), a failure pays `failure_reward`, an
    invalid turn under on_invalid: continue moves on, and with no `success` there is no verdict."""
    import random

    from orchestrator.envs.pipeline import PipelineConfig, PipelineEnv
    from orchestrator.messages import Message

    config = PipelineConfig(order=["coder", "reviewer"], max_rounds=3,
                            loop_back={"from": "reviewer", "to": "coder", "field": "verdict", "values": ["redo", "fix"]},
                            success={"role": "reviewer", "field": "verdict", "values": ["ok", "fine"],
                                     "reward": 2.0, "failure_reward": -0.5})

    def play(config, contents):
        env = PipelineEnv(config, dict.fromkeys(config.order), {}, random.Random(0))
        played = []
        for content in contents:
            role = env.next_role()
            played.append(role)
            result = asyncio.run(env.step(role, Message(id="e", episode="e", turn=0, sender=role, recipients=[],
                                                        content=content, raw="", valid=content is not None)))
        assert result.done and env.next_role() is None
        return played, result, env.outcome()

    played, result, outcome = play(config, [{}, {"verdict": "fix"}, None, {"verdict": "fine"}])
    assert played == ["coder", "reviewer"] * 2 and outcome == {"rounds": 2, "succeeded": True}
    assert result.rewards == {"coder": 2.0, "reviewer": 2.0}
    played, result, outcome = play(config, [{}, {"verdict": "redo"}, {}, {"verdict": "nope"}])
    assert outcome == {"rounds": 2, "succeeded": False} and result.rewards == {"coder": -0.5, "reviewer": -0.5}
    played, result, outcome = play(config.model_copy(update={"success": None}), [{}, {"verdict": "ok"}])
    assert outcome == {"rounds": 1, "succeeded": None} and result.rewards == {}

def test_user_role_in_temp_folder_runs_with_python_policy(workspace, cli, monkeypatch):
    write(workspace / "mypolicies.py", """
        import json
        def echo(request):
            return json.dumps({"say": request.context["task"]["text"]})
        """)
    monkeypatch.syspath_prepend(str(workspace))
    code, out, err = cli("run", workspace / "team.yaml", "--episodes", "2", "--out", workspace / "run", "--no-progress",
                         "--json", "--policy", "echo=python:mypolicies:echo", "--policy", "reviewer=builtin:stub")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == {"ok": 2} and summary["valid_turn_rate"] == 1.0
    episodes = read_transcripts(workspace / "run")
    assert [e["turns"][0]["content"] for e in episodes] == [{"say": "the sea"}, {"say": "the sky"}]
    assert "transcripts.jsonl" in err


def stalled_run(workspace: Path, ctrl_c: signal.Handlers, busy_s: float = 0) -> subprocess.Popen:
    """A run whose one turn awaits a 3 s stall to its end, as a sandbox's run is awaited, after
    ``busy_s`` of work that holds the loop's thread; started once the turn has begun."""
    write(workspace / "stalls.py", f"""
        import asyncio, time
        from pathlib import Path
        from sandboxes.runner import ended_first

        async def stalls(request):
            Path("playing").touch()
            time.sleep({busy_s})
            try:
                await ended_first(asyncio.get_running_loop().run_in_executor(None, time.sleep, 3))
            except asyncio.CancelledError:
                Path("cleaned").touch()
                raise
        """)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", workspace / "team.yaml", "--out",
                             workspace / "run", "--no-progress", "--policy", "echo=python:stalls:stalls",
                             "--policy", "reviewer=builtin:stub"], stderr=subprocess.PIPE, text=True, cwd=workspace,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(workspace)])},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, ctrl_c))
    deadline = time.monotonic() + 60
    while not (workspace / "playing").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    return proc


@pytest.mark.parametrize("signum, ctrl_c", [(signal.SIGINT, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                                            (signal.SIGTERM, signal.SIG_IGN)])
def test_a_second_signal_leaves_the_clean_up_to_its_end(workspace, signum, ctrl_c):
    """SIGTERM stops a run as Ctrl-C does: the first cancels the run, whose clean-up waits for a
    sandbox's run to end (code_pair's workdirs are removed after it), and a second leaves that
    wait alone. A second SIGTERM broke it off: tracebacks, tasks destroyed pending, workdirs left;
    it still did in a job started in the background (``ctrl_c`` SIG_IGN: SIGINT ignored). The run
    is given its SIGINT disposition, not this process's: pytest started in the background ignored
    the test's SIGINT too."""
    proc = stalled_run(workspace, ctrl_c)
    proc.send_signal(signum)
    time.sleep(0.5)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    said = "rolecast: interrupted" if signum == signal.SIGINT else "rolecast: terminated"
    assert (proc.returncode, err.strip()) == (128 + signum, said)
    assert (workspace / "cleaned").exists()


def test_sigterm_in_the_background_stops_a_run_between_steps_of_its_loop(workspace):
    """With SIGINT ignored (a job started in the background) there is no asyncio handler to
    cancel the run: SIGTERM's Terminated was raised wherever the loop's thread was, here in a
    turn's own code, which then never reached the clean-up its ``except`` holds."""
    proc = stalled_run(workspace, signal.SIG_IGN, busy_s=1.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.strip()) == (128 + signal.SIGTERM, "rolecast: terminated")
    assert (workspace / "cleaned").exists()


def test_a_command_gives_back_sigterm_as_it_found_it(cli):
    """Its handler left behind, the next command in this process (a test, a script) found SIGTERM
    taken, set none of its own, and a SIGTERM then stopped it as Ctrl-C: exit 130, "interrupted"."""
    assert cli("plugins", "--json")[0] == 0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_run_json_prints_only_the_summary_on_stdout_with_the_progress_bar_on(workspace, cli, monkeypatch):
    """``rolecast run --json | jq``: the bar draws on stderr, as the logs do."""
    write(workspace / "mypolicies.py", """
        def echo(request):
            return '{"say": "hi"}'
        """)
    monkeypatch.syspath_prepend(str(workspace))
    code, out, err = cli("run", workspace / "team.yaml", "--episodes", "2", "--out", workspace / "run", "--json",
                         "--policy", "echo=python:mypolicies:echo", "--policy", "reviewer=builtin:stub")
    assert code == 0, err
    assert json.loads(out)["status"] == {"ok": 2}  # the whole of stdout: one JSON line
    assert "2/2" in err


def test_a_progress_bars_label_is_text_not_markup(capsys):
    """A training run's bar is labelled with its folder's name: `--out runs/exp[lr=1e-4]` read
    "exp steps", its "[lr=1e-4]" taken for a style (rich markup)."""
    from orchestrator.rollout import progress_bar

    with (bar := progress_bar(True)):
        bar.add_task("exp[lr=1e-4] steps", total=1)
    assert "exp[lr=1e-4] steps" in capsys.readouterr().err


def test_log_json_leaves_no_progress_bar_among_the_json_lines_on_stderr(workspace, cli):
    """``rolecast --log-json run ... 2> log.jsonl``: the bar's last frame was a line of console text there."""
    code, out, err = cli("--log-json", "run", workspace / "team.yaml", "--episodes", "2", "--out", workspace / "run",
                         "--policy", "echo=builtin:stub", "--policy", "reviewer=builtin:stub")
    assert code == 0 and "transcripts.jsonl" in out
    assert "2/2" not in err and all(isinstance(json.loads(line), dict) for line in err.splitlines())


def test_log_json_says_a_commands_notes_and_errors_on_stderr_as_json_lines(workspace, cli):
    """``run --json`` names its transcripts on stderr, and a mistake is one line there: both were
    console text among the JSON log lines."""
    args = ("--log-json", "run", workspace / "team.yaml", "--episodes", "2", "--json", "--policy", "reviewer=builtin:stub")
    code, out, err = cli(*args, "--policy", "echo=builtin:stub", "--out", workspace / "run")
    assert code == 0 and json.loads(out)["status"] == {"ok": 2}
    lines = [json.loads(line) for line in err.splitlines()]
    assert lines[-1]["event"] == f"transcripts: {workspace / 'run' / 'transcripts.jsonl'}"
    code, out, err = cli(*args, "--policy", "chef=builtin:stub", "--out", workspace / "again")
    [line] = [json.loads(line) for line in err.splitlines()]
    assert code == 2 and out == "" and line["level"] == "error" and "unknown role(s) chef" in line["event"]
    code, _, err = cli(*args, "--policy", "echo=python:json:loads", "--out", workspace / "failed")
    lines = [json.loads(line) for line in err.splitlines()]
    assert code == 1 and lines[-1]["level"] == "error" and "every episode failed" in lines[-1]["event"]


def test_log_json_renders_libraries_log_records_and_python_warnings_as_json_lines(workspace):
    """A library's logging warning (transformers' report of a checkpoint's missing weights, once
    the model's library is loaded) and a Python warning were their plain text among --log-json's
    JSON lines."""
    write(workspace / "noisy.py", """
        import logging, warnings
        from transformers.utils import logging as hf_logging

        def echo(request):
            logging.getLogger("somelib").warning("rate limited, retrying")
            hf_logging.get_logger("transformers.modeling_utils").warning("weights missing")
            warnings.warn("old API", DeprecationWarning)
            return '{"say": "hi"}'
        """)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "--log-json", "run", workspace / "team.yaml",
                           "--episodes", "1", "--out", workspace / "run", "--json", "--policy", "echo=python:noisy:echo",
                           "--model", "tiny", "--dtype", "float32"], capture_output=True, text=True, cwd=workspace, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(workspace)]),
                               "PYTHONWARNINGS": "always"})
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    said = {(line["level"], line.get("logger")): line["event"] for line in lines}
    assert said[("warning", "somelib")] == "rate limited, retrying"
    assert said[("warning", "transformers.modeling_utils")] == "weights missing"  # transformers' own handler, before
    assert "DeprecationWarning: old API" in said[("warning", "py.warnings")]


def test_a_library_record_is_one_line_however_often_logging_is_configured(capsys):
    """The CLI's main configures logging each time it is called in one process (the Python API,
    a notebook): a handler added each time printed a library's warning once per call."""
    import logging

    from orchestrator import logs

    for json_logs in (True, True, False):
        logs.configure(json_logs=json_logs, libraries=True)
    capsys.readouterr()
    logging.getLogger("somelib").warning("rate limited, retrying")
    [line] = capsys.readouterr().err.splitlines()
    assert "rate limited, retrying" in line and not line.startswith("{")  # the last configure's renderer
    assert "\x1b[" not in line  # stderr is no terminal here: no colour codes in a file it goes to
    logs.configure()


def test_log_lines_go_to_the_stderr_of_the_time_they_are_written():
    """Progress bars and tests swap sys.stderr after logging is configured: lines written to the
    stderr of configure's time went around them."""
    import contextlib
    import io
    import logging

    import structlog

    from orchestrator import logs

    logs.configure(libraries=True)
    with contextlib.redirect_stderr(io.StringIO()) as swapped:
        structlog.get_logger().info("episode done", n=3)
        logging.getLogger("somelib").warning("rate limited, retrying")
    assert "episode done" in swapped.getvalue() and "rate limited, retrying" in swapped.getvalue()
    logs.configure()


def test_unknown_role_in_policy_flag(workspace, cli):
    code, _, err = cli("run", workspace / "team.yaml", "--policy", "chef=builtin:stub")
    assert code == 2 and "unknown role(s) chef" in err


def test_judge_sees_the_sides_in_a_seeded_random_order(tmp_path):
    team = load_team(ROOT / "recipes/debate.yaml")
    seen: dict[str, list] = {"judge": [], "pro": []}

    def record(request):
        if request.role in seen:
            seen[request.role].append(tuple(d["role"] for d in request.context["debaters"]))
        if request.role == "judge":
            return '{"winner": "for", "reason": "r"}'
        return '{"argument": "a"}'

    policies = {name: PythonPolicy(record) for name in team.roles}
    asyncio.run(run_team(team, policies, RunOptions(episodes=16, seed=3, out_dir=tmp_path, progress=False)))
    assert set(seen["judge"]) == {("pro", "con"), ("con", "pro")}  # position bias cannot favour one side
    assert set(seen["pro"]) == {("pro", "con")}


def test_a_run_where_every_episode_fails_exits_1_with_the_error(cli, tmp_path):
    args = ("run", ROOT / "recipes/guess_number.yaml", "--policy", "guesser=python:json:loads", "--episodes", "2",
            "--no-progress")
    code, _, err = cli(*args, "--out", tmp_path / "run")
    assert code == 1 and "every episode failed; the first: TypeError" in err
    # and an --out that already holds a run is refused, its files untouched
    before = (tmp_path / "run" / "transcripts.jsonl").read_bytes()
    code, _, err = cli(*args, "--out", tmp_path / "run")
    assert code == 2 and "already holds a run" in err
    assert (tmp_path / "run" / "transcripts.jsonl").read_bytes() == before


def test_a_disk_that_fills_up_during_a_run_is_one_line_naming_the_file(cli, small_disk):
    # a traceback from the transcripts' flush (or the lock file's write, on a disk already full)
    code, _, err = cli("run", ROOT / "recipes/guess_number.yaml", "--policy", "guesser=python:json:loads",
                       "--episodes", "300", "--no-progress", "--out", small_disk / "run")
    assert (code, err.splitlines()[-1]) == (1, f"rolecast: {small_disk / 'run' / 'transcripts.jsonl'}: No space left on device")
    with pytest.raises(OSError), open(small_disk / "more", "wb") as fh:  # the last blocks too
        fh.write(bytes(64 * 1024))
    code, _, err = cli("run", ROOT / "recipes/guess_number.yaml", "--episodes", "2", "--out", small_disk / "next")
    assert (code, err.strip()) == (1, f"rolecast: {small_disk / 'next' / '.rolecast.lock'}: No space left on device")
    assert not (small_disk / "next").exists()


def test_a_disk_that_fills_during_a_run_leaves_transcripts_of_whole_lines(cli, small_disk):
    """The episode whose line the disk took half of left that half as the file's last line: a
    JSON-lines reader of the stopped run's transcripts failed."""
    code, _, err = cli("run", ROOT / "recipes/guess_number.yaml", "--policy", "guesser=python:json:loads",
                       "--episodes", "300", "--no-progress", "--out", small_disk / "run")
    assert code == 1 and "No space left on device" in err
    assert (small_disk / "run" / "transcripts.jsonl").read_bytes().endswith(b"\n")
    assert 0 < len(read_transcripts(small_disk / "run")) < 300


def test_an_empty_out_is_refused_not_the_current_folder(cli, capsys, tmp_path, monkeypatch):
    """``--out "$RUN"`` with RUN unset: Path("") is ".", and the run's files went among the user's."""
    monkeypatch.chdir(tmp_path)
    for command in ("run", "eval", "train", "compare"):
        with pytest.raises(SystemExit) as stopped:
            cli(command, ROOT / "recipes/guess_number.yaml", "--out", "")
        assert stopped.value.code == 2 and "argument --out: empty: give a folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


COMPUTE_FLAGS = ("--model", "m", "--dtype", "float32", "--engine", "vllm", "--device", "cuda:1", "--ray", "auto",
                 "--rollout-workers", "3", "--seed", "5", "--out", "o", "--no-progress")
COMPUTE = {"model": "m", "dtype": "float32", "engine": "vllm", "device": "cuda:1", "ray": "auto", "rollout_workers": 3,
           "seed": 5, "out": Path("o"), "progress": False}


@pytest.mark.parametrize("command, call, flags, keywords", [
    ("run", "run", ("--episodes", "4", "--task", "3", "--task", "9", "--concurrency", "2", "--timeout", "1.5",
                    "--policy", "a=builtin:stub", "--policy", "b=replay:b.jsonl", "--adapter", "x=ax", "--adapter", "y=ay"),
     {"episodes": 4, "tasks": ["3", "9"], "concurrency": 2, "timeout": 1.5,
      "policies": {"a": "builtin:stub", "b": "replay:b.jsonl"}, "adapters": {"x": "ax", "y": "ay"}}),
    ("eval", "evaluate", ("--episodes", "4", "--held-out", "--opponent", "minimax", "--concurrency", "2",
                          "--timeout", "2.5", "--policy", "a=builtin:stub", "--adapter", "x=ax"),
     {"episodes": 4, "held_out": True, "opponent": "minimax", "concurrency": 2, "timeout": 2.5,
      "policies": {"a": "builtin:stub"}, "adapters": {"x": "ax"}}),
    ("train", "train", ("--steps", "3", "--resume", "--set", "group_size=4", "--set", "adam.learning_rate=0.001"),
     {"steps": 3, "resume": True, "sets": {"group_size": 4, "adam.learning_rate": 0.001}}),
])
def test_each_flag_reaches_its_keyword_of_the_api(cli, monkeypatch, command, call, flags, keywords):
    """The commands parse their flags into the Python API's calls: a flag dropped on the way (--device,
    a second --task) or handed to another keyword would be ignored, said nowhere."""
    seen = {}

    def api_call(team, **given):
        seen.update(given, team=team)
        raise RolecastError("stop here")

    monkeypatch.setattr(f"orchestrator.api.{call}", api_call)
    code, _, err = cli(command, "team.yaml", *flags, *COMPUTE_FLAGS)
    assert code == 2 and "stop here" in err
    assert {k: seen[k] for k in ("team", *keywords, *COMPUTE)} == {"team": Path("team.yaml"), **keywords, **COMPUTE}


@pytest.mark.parametrize("flags, message", [
    (("--seed", "-1"), "argument --seed: a seed is 0 to 2**63 - 1, got -1"),
    (("--seed", str(2**63)), f"argument --seed: a seed is 0 to 2**63 - 1, got {2**63}"),
    (("--timeout", "0"), "argument --timeout: must be above 0, got 0"),
    (("--concurrency", "0"), "argument --concurrency: must be at least 1, got 0"),  # not the team's, silently
    (("--rollout-workers", "0"), "argument --rollout-workers: must be at least 1, got 0"),
])
def test_flags_out_of_range_are_argparse_errors(cli, capsys, flags, message):
    with pytest.raises(SystemExit) as stopped:
        cli("run", ROOT / "recipes/guess_number.yaml", *flags)
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    for edge in (0, 2**63 - 1):  # each bound is a seed: 0, a recipe's default, too
        assert build_parser().parse_args(["run", "team.yaml", "--seed", str(edge)]).seed == edge


def test_a_bare_ray_flag_starts_ray_here_as_its_help_says():
    """``--ray`` alone is ``local``, a Ray started in this process; ``auto`` joins a running cluster,
    and on a machine with none fails to connect."""
    for command in ("run", "eval", "train", "compare"):
        assert build_parser().parse_args([command, "team.yaml", "--ray"]).ray == "local"


def test_a_policy_or_adapter_flag_without_its_value_is_one_line(cli):
    for flag, expected in (("--policy", "expected ROLE=BINDING"), ("--adapter", "expected NAME=PATH")):
        for text in ("guesser=", "=x"):  # nor a value without its role (or name)
            code, _, err = cli("run", ROOT / "recipes/guess_number.yaml", flag, text)
            assert code == 2 and f"rolecast: {flag} {text!r}: {expected}" in err, err


def test_a_path_name_too_long_is_one_line_naming_it(cli, tmp_path):
    """A folder or file name past the file system's 255 bytes was an OSError traceback from wherever
    it was first used: --out, `report RUN_DIR`, a recipe's path."""
    long = tmp_path / ("x" * 300)
    for args in (("run", ROOT / "recipes/guess_number.yaml", "--out", long), ("report", long), ("validate", f"{long}.yaml")):
        code, _, err = cli(*args)
        assert code == 2 and "Traceback" not in err, err
        assert err.strip().startswith(f"rolecast: {long}") and err.strip().endswith(": File name too long"), err


def test_a_task_the_environment_cannot_take_is_one_line(cli, tmp_path):
    code, _, err = cli("run", ROOT / "recipes/guess_number.yaml", "--task", "abc", "--out", tmp_path / "run")
    assert code == 2 and "--task abc: the secret is a whole number, got 'abc'" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_an_empty_system_message_is_none_and_null_is_the_default(workspace):
    """`system: ""` (a model whose chat template has no system role) had sent the default one."""
    from orchestrator.role import load_role

    text = (workspace / "echo.yaml").read_text()
    for system, first in ((None, {"role": "system", "content": "You are the echo. Repeats the task."}),
                          ('""', None), ("'{% if false %}Be brief.{% endif %}'", None),
                          ("'Be brief.'", {"role": "system", "content": "Be brief."}),
                          ('"Be brief.\\n"', {"role": "system", "content": "Be brief."})):  # stripped, as the prompt is
        (workspace / "echo.yaml").write_text(text if system is None else text + f"system: {system}\n")
        messages = load_role(workspace / "echo.yaml").render({"task": {"text": "the sea"}, "role": "echo",
                                                              "description": "", "params": {}, "schema": ""})
        assert messages[-1] == {"role": "user", "content": "Say something about the sea."}
        assert (messages[0] if len(messages) == 2 else None) == first


def test_a_system_message_is_rendered_with_the_task_the_template_it_includes_reads(workspace):
    """A `system` whose included template reads the task was rendered once, for no task, as if it
    read only the role's fields: every episode failed (UndefinedError: 'dict object' has no
    attribute 'text')."""
    from orchestrator.role import load_role

    write(workspace / "prompts" / "sys.md.j2", "You are the {{ role }}. The topic: {{ task.text }}.\n")
    (workspace / "echo.yaml").write_text((workspace / "echo.yaml").read_text() + "system: '{% include \"sys.md.j2\" %}'\n")
    spec = load_role(workspace / "echo.yaml")
    for topic in ("the sea", "the sky"):
        assert spec.render(spec.context({"text": topic}, {}))[0] == {"role": "system", "content": f"You are the echo. The topic: {topic}."}


def test_a_field_named_like_a_dict_method_is_the_field(workspace):
    """Jinja reads `a.b` as an attribute first: a Planner's `items` list reached the prompt as
    `<built-in method items of dict object at 0x...>`, and `keys | length` failed the episode.
    A dict without the field keeps its methods."""
    from orchestrator.role import load_role

    write(workspace / "prompts" / "echo.md.j2", "{{ task.items | join(', ') }}; {{ task.keys | length }}; {{ task.get }}; "
                                                "{% for k, v in task.plan.items() %}{{ k }}={{ v }}{% endfor %}\n")
    spec = load_role(workspace / "echo.yaml")
    task = {"items": ["parse", "test"], "keys": [1, 2, 3], "get": "x", "plan": {"n": 2}}
    assert spec.render(spec.context(task, {}))[-1]["content"] == "parse, test; 3; x; n=2"


def test_a_task_field_a_prompt_misspells_fails_its_render(workspace):
    """Templates are StrictUndefined (README): load checks only the top-level `task`, so without it
    `{{ task.txet }}` rendered as nothing, a prompt with its task left out."""
    import jinja2

    from orchestrator.role import load_role

    write(workspace / "prompts" / "echo.md.j2", "Say something about {{ task.txet }}.\n")
    spec = load_role(workspace / "echo.yaml")
    with pytest.raises(jinja2.UndefinedError, match="'dict object' has no attribute 'txet'"):
        spec.render(spec.context({"text": "the sea"}, {}))


def test_a_render_that_fails_names_the_template_its_line_and_the_role(workspace):
    """Jinja's own "'dict object' has no attribute 'txet'" named no file, line or role: with roles
    that share a prompt, or a prompt that includes another, an episode's error left it to be found."""
    import jinja2

    from orchestrator.role import load_role

    write(workspace / "prompts" / "echo.md.j2", "Say something\n{% include 'topic.md.j2' %}\n")
    write(workspace / "prompts" / "topic.md.j2", "about\n{{ task.txet }}.\n")
    text = (workspace / "echo.yaml").read_text()
    for system, said in ((None, f"{workspace / 'prompts' / 'topic.md.j2'}:2: prompt"),
                         ("'Talk of {{ task.txet }}.'", "system")):  # written in the YAML: no file of its own
        (workspace / "echo.yaml").write_text(text if system is None else text + f"system: {system}\n")
        spec = load_role(workspace / "echo.yaml")
        with pytest.raises(jinja2.UndefinedError) as caught:
            spec.render(spec.context({"text": "the sea"}, {}))
        assert str(caught.value) == f"{said}: 'dict object' has no attribute 'txet' (role 'echo')"
