"""generate_judge: the Generator is paid for a right answer, the Judge for a verdict that agrees
with the truth of the answer it was shown, whichever way it went; balanced, that answer is right
half the time."""
from __future__ import annotations

import json
import re

import pytest
from play import Script, another_shape, play, team
from support import ROOT

from orchestrator.errors import ConfigError
from orchestrator.team import load_team


def generator(right: bool):
    def answer(request) -> str:
        a, op, b = re.search(r"Compute (\d+) ([-+*]) (\d+)", request.messages[-1]["content"]).groups()
        value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        return json.dumps({"answer": value if right else value + 1})
    return answer


@pytest.mark.parametrize("right, verdict, rewards", [
    (True, "correct", {"generator": 1.0, "judge": 1.0}),
    (True, "incorrect", {"generator": 1.0, "judge": 0.0}),
    (False, "incorrect", {"generator": 0.0, "judge": 1.0}),
    (False, "correct", {"generator": 0.0, "judge": 0.0}),
])
def test_the_judge_is_paid_for_agreeing_with_the_truth(tmp_path, right, verdict, rewards):
    judge = Script({"verdict": verdict})
    (ep,) = play(team("generate_judge", balanced_judge=False), {"generator": generator(right), "judge": judge},
                 tmp_path).episodes
    assert ep.status == "ok", ep.error
    assert [t.role for t in ep.turns] == ["generator", "judge"]
    assert ep.rewards == rewards
    assert ep.outcome["answer_correct"] is right and ep.outcome["verdict"] == verdict
    shown = judge.requests[0].messages[-1]["content"]
    assert f"Proposed answer: {ep.outcome['answer']}" in shown


def test_an_invalid_verdict_earns_nothing_and_problems_vary(tmp_path):
    episodes = play(team("generate_judge"), {"generator": generator(True), "judge": Script(*["maybe"] * 12)},
                    tmp_path, episodes=6).episodes
    assert [ep.rewards["judge"] for ep in episodes] == [-0.5] * 6  # no agreement, and the invalid-turn penalty
    assert all(ep.outcome["verdict"] is None for ep in episodes)
    assert len({json.dumps(ep.outcome["problem"]) for ep in episodes}) > 1
    assert all(0 <= ep.outcome["problem"]["a"] <= 20 for ep in episodes)


@pytest.mark.parametrize("right", [True, False])
def test_the_recipes_balanced_judge_sees_right_answers_half_the_time_and_is_paid_for_what_it_saw(tmp_path, right):
    def judge(request) -> str:  # says "correct" exactly when the answer it was shown is right
        a, op, b = re.search(r"Problem: (-?\d+) ([-+*]) (-?\d+)", request.messages[-1]["content"]).groups()
        shown = int(re.search(r"Proposed answer: (-?\d+)", request.messages[-1]["content"])[1])
        value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        return json.dumps({"verdict": "correct" if shown == value else "incorrect"})

    episodes = play(team("generate_judge"), {"generator": generator(right), "judge": judge},
                    tmp_path, episodes=40).episodes
    shown_right = [ep.outcome["shown_correct"] for ep in episodes]
    assert 10 <= sum(shown_right) <= 30  # a fair coin per episode, whatever the Generator does
    for ep in episodes:
        o = ep.outcome
        assert o["answer_correct"] is right and ep.rewards == {"generator": float(right), "judge": 1.0}
        if o["shown_correct"] == right:
            assert o["shown"] == o["answer"]  # the Generator's answer, when it lies on the coin's side
        else:
            assert o["shown"] != o["answer"] and (o["shown"] == o["truth"]) == o["shown_correct"]
    # a constant verdict is worth about half: only telling answers apart pays
    constant = play(team("generate_judge"),
                    {"generator": generator(right), "judge": Script(*[{"verdict": "incorrect"}] * 40)},
                    tmp_path, episodes=40).episodes
    assert [ep.rewards["judge"] for ep in constant] == [float(not s) for s in shown_right]


def test_a_balanced_judge_never_sees_a_missing_answer(tmp_path):
    """An invalid Generator turn leaves no answer: shown as none, the wrong half of the coin was
    a giveaway ("incorrect" at sight), not an answer to check."""
    judge = Script(*[{"verdict": "incorrect"}] * 24)
    episodes = play(team("generate_judge"), {"generator": Script(*["no idea"] * 48), "judge": judge},
                    tmp_path, episodes=24).episodes
    assert all(ep.outcome["answer"] is None for ep in episodes)
    assert all(isinstance(ep.outcome["shown"], int) for ep in episodes)
    assert all(re.search(r"Proposed answer: -?\d+", r.messages[-1]["content"]) for r in judge.requests)
    assert 6 <= sum(ep.outcome["shown_correct"] for ep in episodes) <= 18  # still a fair coin


def test_outcome_metrics_see_through_a_constant_judge(tmp_path):
    from orchestrator.envs.generate_judge import GenerateJudgeEnv

    t = team("generate_judge", balanced_judge=False)
    always_no = play(t, {"generator": generator(False), "judge": Script({"verdict": "incorrect"})}, tmp_path,
                     episodes=6)
    # every answer wrong and rejected: the reward is perfect, and no right answer was seen to judge
    assert [ep.rewards["judge"] for ep in always_no.episodes] == [1.0] * 6
    assert always_no.summary["env"] == {"judge_rejects_wrong": 1.0}
    outcomes = [{"shown_correct": True, "verdict": "incorrect"}] * 1 + [{"shown_correct": False, "verdict": "incorrect"}] * 9
    assert GenerateJudgeEnv.outcome_metrics(t.env_config, outcomes) == {
        "judge_accepts_right": 0.0, "judge_rejects_wrong": 1.0, "judge_balanced_accuracy": 0.5}  # reward 0.9
    assert GenerateJudgeEnv.outcome_metrics(t.env_config, []) == {}
    no_verdict = [{"shown_correct": True, "verdict": None}, {"shown_correct": False, "verdict": None}]
    assert GenerateJudgeEnv.outcome_metrics(t.env_config, no_verdict) == {  # a miss either way
        "judge_accepts_right": 0.0, "judge_rejects_wrong": 0.0, "judge_balanced_accuracy": 0.0}


def test_a_worker_works_the_problem_before_the_judge_sees_its_result_and_the_answer(tmp_path):
    def judge(request) -> str:  # compares the worker's result with the answer shown
        text = request.messages[-1]["content"]
        own = re.search(r"Your own result: (-?\d+)", text)[1]
        shown = re.search(r"Proposed answer: (-?\d+)", text)[1]
        return json.dumps({"verdict": "correct" if own == shown else "incorrect"})

    t = team("generate_judge_worker")
    assert t.roles["worker"].config.policy.adapter == t.roles["judge"].config.policy.adapter  # the Judge, working
    episodes = play(t, {"generator": generator(False), "worker": generator(True), "judge": judge}, tmp_path,
                    episodes=8).episodes
    for ep in episodes:
        assert ep.status == "ok", ep.error
        assert [turn.role for turn in ep.turns] == ["generator", "worker", "judge"]
        assert ep.outcome["own"] == ep.outcome["truth"]  # the worker never saw the answer it will check
        assert ep.rewards == {"generator": 0.0, "worker": 1.0, "judge": 1.0}
    with pytest.raises(ValueError, match="must be different roles"):
        team("generate_judge", worker="judge")


def test_eval_reports_the_judges_balanced_accuracy(cli, tmp_path):
    code, out, err = cli("eval", ROOT / "recipes/generate_judge.yaml", "--model", "tiny", "--dtype", "float32",
                         "--episodes", "6", "--json", "--out", tmp_path / "ev")
    assert code == 0, err
    env = json.loads(out.strip().splitlines()[-1])["env"]
    assert set(env) <= {"judge_accepts_right", "judge_rejects_wrong", "judge_balanced_accuracy"} and env
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["env"] == env


@pytest.mark.parametrize("recipe, needed", [("generate_judge", 2), ("generate_judge_worker", 3)])
def test_fewer_max_turns_than_the_judge_needs_are_refused_at_load(tmp_path, recipe, needed):
    """Under a max_turns below the Judge's turn every episode stopped with no verdict and no reward."""
    path = tmp_path / "gj.yaml"
    path.write_text((ROOT / "recipes" / f"{recipe}.yaml").read_text() + f"max_turns: {needed - 1}\n")
    with pytest.raises(ConfigError, match=f"a whole game can take {needed} turns and max_turns is {needed - 1}"):
        load_team(path)


def test_problems_draw_every_op_and_operands_from_zero(tmp_path):
    episodes = play(team("generate_judge", max_operand=1), {"generator": generator(True), "judge": Script(
        *[{"verdict": "correct"}] * 30)}, tmp_path, episodes=30).episodes
    problems = [ep.outcome["problem"] for ep in episodes]
    assert {p["op"] for p in problems} == {"+", "-", "*"}
    assert {p["a"] for p in problems} == {p["b"] for p in problems} == {0, 1}


def test_a_wrong_answer_shown_is_never_the_truth_and_may_be_another_ops():
    import random

    from orchestrator.envs.generate_judge import GenerateJudgeEnv

    t = team("generate_judge")
    other_ops, offsets = 0, set()
    for seed in range(200):
        env = GenerateJudgeEnv(t.env_config, t.roles, {}, random.Random(seed))
        env.show_right = False
        shown = env._for_judge(env.truth)
        assert shown != env.truth
        other_ops += shown not in {env.truth + d for d in (-10, -1, 1, 10)}
        offsets.add(shown - env.truth)
    assert other_ops > 20  # a + b shown for a * b: a slip a Judge must catch too
    assert {-10, -1, 1, 10} <= offsets  # the truth off by 1 or 10, either way


def test_only_the_judge_sees_the_answer_and_the_workers_result_and_a_wrong_worker_earns_nothing(tmp_path):
    generator_, worker = Script(*[{"answer": 0}] * 4), Script(*[{"answer": -999}] * 4)
    episodes = play(team("generate_judge_worker"), {"generator": generator_, "worker": worker,
                                                    "judge": Script(*[{"verdict": "correct"}] * 4)},
                    tmp_path, episodes=4).episodes
    assert [ep.rewards["worker"] for ep in episodes] == [0.0] * 4
    for request in generator_.requests + worker.requests:
        assert request.context["answer"] is None and request.context["own"] is None


def test_a_verdict_other_than_correct_or_incorrect_is_none(tmp_path):
    """For a judge whose schema allows more: "maybe" is no verdict, and agrees with nothing."""
    import dataclasses

    t = team("generate_judge", balanced_judge=False)
    loose = {"type": "object", "properties": {"verdict": {"type": "string"}}, "required": ["verdict"]}
    t = dataclasses.replace(t, roles={**t.roles, "judge": dataclasses.replace(t.roles["judge"], schema=loose)})
    (ep,) = play(t, {"generator": generator(True), "judge": Script({"verdict": "maybe"})}, tmp_path).episodes
    assert ep.outcome["verdict"] is None and ep.rewards["judge"] == 0.0


@pytest.mark.parametrize("role, other, field", [("judge", "solver", "verdict"), ("generator", "verifier", "answer")])
def test_roles_of_another_shape_are_refused_at_load(tmp_path, role, other, field):
    """A judge with a solver's schema loaded, then gave no verdict in any episode."""
    with pytest.raises(ConfigError, match=rf"GenerateJudgeEnv reads field\(s\) {field} of the messages of role '{role}'"):
        load_team(another_shape(tmp_path, "generate_judge", role, other))
