"""Turn-level credit: scored moves get w * (score - the group's mean at that position), and turns
that saw the same prompt w * (reward - the mean reward of those turns, across groups), on top of
the episode's advantage, in the datums, in credit.jsonl and in the step's metrics."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import credit, make_attempt, make_episode, metric_rows, train_tiny

from orchestrator.errors import RolecastError
from orchestrator.training.datums import role_datums
from orchestrator.training.turn_credit import combined, history_advantages, turn_advantages

ROOT = Path(__file__).resolve().parents[2]


def scored(*turns: tuple[str, float | None]):
    """An episode whose turns are (role, score), one valid attempt each."""
    ep = make_episode(*((role, [make_attempt([1], [2], [-0.5])]) for role, _ in turns))
    for turn, (_, score) in zip(ep.turns, turns):
        turn.score = score
    return ep


def test_each_turn_is_compared_with_the_same_position_in_its_group():
    a = scored(("g", 1.0), ("x", 0.3), ("g", 0.5), ("g", 1.0))
    b = scored(("g", 0.5), ("g", None), ("g", 0.0))
    c = scored(("x", 0.9))
    faulted = scored(("g", 9.0), ("x", 9.0))
    faulted.status = "error"  # its scores are compared with no one's
    (out,) = turn_advantages([[a, b, c, faulted]], ["g", "x"], weight=2.0)
    # g's first turns: 1.0 and 0.5 (mean 0.75); second: a's 0.5 alone (b's is unscored); third:
    # 1.0 and 0.0 (mean 0.5); x's first: 0.3 and 0.9 (mean 0.6)
    assert out[0] == {"g": {0: pytest.approx(0.5), 2: 0.0, 3: pytest.approx(1.0)}, "x": {1: pytest.approx(-0.6)}}
    assert out[1] == {"g": {0: pytest.approx(-0.5), 2: pytest.approx(-1.0)}, "x": {}}
    assert out[2] == {"g": {}, "x": {0: pytest.approx(0.6)}}
    assert out[3] == {"g": {}, "x": {}}
    (alone,) = turn_advantages([[b]], ["g"], weight=2.0)
    assert alone == [{"g": {0: 0.0, 2: 0.0}}]  # a group of one has nothing to compare with


def test_each_group_is_its_own_baseline():
    """Groups play different tasks: a turn is compared with its own group's, never another's."""
    high, higher = scored(("g", 1.0)), scored(("g", 0.8))
    low, lower = scored(("g", 0.0)), scored(("g", -0.4))
    out = turn_advantages([[high, higher], [low, lower]], ["g"], weight=1.0)
    assert out == [[{"g": {0: pytest.approx(0.1)}}, {"g": {0: pytest.approx(-0.1)}}],
                   [{"g": {0: pytest.approx(0.2)}}, {"g": {0: pytest.approx(-0.2)}}]]


def seen(*prompts: list[int], role: str = "g", status: str = "ok"):
    """An episode of ``role``'s turns, each one attempt whose prompt is the given tokens."""
    ep = make_episode(*((role, [make_attempt(prompt, [9], [-0.5])]) for prompt in prompts))
    ep.status = status
    return ep


def test_turns_that_saw_the_same_prompt_are_compared_across_groups():
    # two groups (two secrets): every first turn saw [1]; a's and c's second turns saw [1, 2]
    a, b = seen([1], [1, 2]), seen([1], [1, 3])
    c, d = seen([1], [1, 2], [1, 2, 4]), seen([1])
    rewards = [[{"g": 1.0}, {"g": 0.0}], [{"g": 0.5}, {"g": 0.1}]]
    out = history_advantages([[a, b], [c, d]], rewards, ["g"], weight=2.0)
    # first turns: 1.0, 0.0, 0.5, 0.1 (mean 0.4); second: a's 1.0 against c's 0.5 (mean 0.75);
    # b's second and c's third prompts were seen once: nothing
    assert out[0][0] == {"g": {0: pytest.approx(1.2), 1: pytest.approx(0.5)}}
    assert out[0][1] == {"g": {0: pytest.approx(-0.8)}}
    assert out[1][0] == {"g": {0: pytest.approx(0.2), 1: pytest.approx(-0.5)}}
    assert out[1][1] == {"g": {0: pytest.approx(-0.6)}}


def test_history_credit_leaves_out_faults_opponents_and_other_roles():
    ok, faulted = seen([1]), seen([1], status="error")
    opponent, other_role = seen([1]), seen([1], role="x")
    opponent.adapters = {"g": "snapshot-3"}  # a self-play opponent played g: not the learner's turn
    rewards = [[{"g": 1.0, "x": 0.0}, {"g": 0.0, "x": 0.0}, {"g": 0.0, "x": 0.0}, {"g": 0.0, "x": 5.0}]]
    out = history_advantages([[ok, faulted, opponent, other_role]], rewards, ["g", "x"], weight=1.0)
    assert out == [[{"g": {}, "x": {}}] * 4]  # every prompt is alone in its key
    twin = seen([1])
    (group,) = history_advantages([[ok, twin]], [[{"g": 1.0}, {"g": 0.0}]], ["g"], weight=1.0)
    assert group == [{"g": {0: 0.5}}, {"g": {0: -0.5}}]


def test_history_credit_keys_a_turn_by_its_first_prompt_and_skips_what_no_learner_sampled():
    bad, good = make_attempt([1], [9], [-0.5], valid=False), make_attempt([1, 7], [9], [-0.5])
    retried = make_episode(("g", [bad, good]), ("judge", [make_attempt([5], [9], [-0.5])]))  # its retry saw feedback too
    plain = make_episode(("g", [make_attempt([1], [9], [-0.5])]), ("judge", [make_attempt([5], [9], [-0.5])]))
    scripted = [make_episode(("g", [make_attempt()])) for _ in range(2)]  # a Python policy's turns: no prompt tokens
    empty = make_episode(("g", []))  # a turn with no attempt at all
    rewards = [[{"g": 1.0, "judge": 0.0}, {"g": 0.0, "judge": 1.0}, {"g": 0.0}, {"g": 0.0}, {"g": 0.0}]]
    out = history_advantages([[retried, plain, *scripted, empty]], rewards, ["g"], weight=1.0)
    # the judge (not trained) saw the same prompt twice: nothing for it, and no error
    assert out == [[{"g": {0: 0.5}}, {"g": {0: -0.5}}, {"g": {}}, {"g": {}}, {"g": {}}]]


def test_the_kinds_of_turn_credit_add_up_turn_by_turn():
    by_score = [[{"g": {0: 0.25, 2: 1.0}}, {"g": {}}]]
    by_history = [[{"g": {0: 0.5, 1: -1.0}}, {"g": {0: 2.0}}]]
    assert combined(by_score, by_history) == [[{"g": {0: 0.75, 1: -1.0, 2: 1.0}}, {"g": {0: 2.0}}]]
    assert by_score == [[{"g": {0: 0.25, 2: 1.0}}, {"g": {}}]]  # the parts are left as they were
    assert combined(None, by_history) is by_history and combined(None, None) is None


def test_a_turns_extra_advantage_reaches_its_valid_tokens_only():
    first = make_attempt([1, 2], [3, 4], [-0.1, -0.2])
    bad = make_attempt([10], [11], [-0.3], valid=False)
    retry = make_attempt([20], [21], [-0.4])
    ep = make_episode(("p", [first]), ("p", [bad, retry]))
    data = role_datums(ep, "p", 1.0, turn_extra={0: 0.25, 1: -0.5})
    assert [d.loss_fn_inputs["advantages"] for d in data] == [[0.0, 1.25, 1.25], [-1.0], [0.5]]
    assert [d.loss_fn_inputs["advantages"] for d in role_datums(ep, "p", 1.0)] == [[0.0, 1.0, 1.0], [-1.0], [1.0]]


def test_turn_credit_needs_a_protocol_that_scores_moves(cli, tmp_path):
    code, _, err = cli("train", ROOT / "recipes/debate.yaml", "--model", "tiny", "--set", "turn_credit=1",
                       "--out", tmp_path / "run")
    assert code == 2 and "turn_credit: protocol DebateEnv does not score moves" in err, err
    with pytest.raises(RolecastError, match="turn_credit: Input should be greater than or equal to 0"):
        from orchestrator.team import load_team, with_training_options

        with_training_options(load_team(ROOT / "recipes/guess_number.yaml"), {"turn_credit": -1})


def test_a_training_step_credits_each_scored_turn(cli, tmp_path, monkeypatch):
    import orchestrator.training.loop as loop

    seen: list[dict] = []

    def recording(episode, role, advantage, options=None, turn_extra=None):
        seen.append(dict(turn_extra or {}))
        return role_datums(episode, role, advantage, options, turn_extra)

    monkeypatch.setattr(loop, "role_datums", recording)
    run = tmp_path / "run"
    train_tiny(cli, ROOT / "recipes/guess_number.yaml", run, 1, "--set", "turn_credit=2.0", "--set", "group_size=4")
    transcripts = [json.loads(line) for line in (run / "rollouts/step-000001/transcripts.jsonl").read_text().splitlines()]
    scores = {t["id"]: [turn["score"] for turn in t["turns"]] for t in transcripts}
    assert all(s is not None for row in scores.values() for s in row)  # every turn's guess is scored
    lines = credit(run, 1)
    firsts = [scores[line["episode"]][0] for line in lines]
    for line in lines:  # each first guess against the group's mean first guess, times 2
        own = scores[line["episode"]][0]
        assert line["turn_advantages"]["guesser"]["0"] == pytest.approx(2.0 * (own - sum(firsts) / len(firsts)))
    assert [{str(k): v for k, v in extra.items()} for extra in seen] == [line["turn_advantages"]["guesser"] for line in lines]
    (row,) = [r for r in metric_rows(run) if r["kind"] == "train"]
    flat = [s for row_scores in scores.values() for s in row_scores]
    assert row["turn_score/guesser"] == pytest.approx(sum(flat) / len(flat))


def test_a_training_step_credits_turns_that_saw_the_same_prompt(cli, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, ROOT / "recipes/guess_number.yaml", run, 1, "--set", "history_credit=0.5", "--set", "turn_credit=0", "--set", "group_size=2",
               "--set", "groups_per_step=4")
    transcripts = {t["id"]: t for t in map(json.loads, (run / "rollouts/step-000001/transcripts.jsonl").read_text().splitlines())}
    lines = credit(run, 1)
    assert len({transcripts[line["episode"]]["task"]["secret"] for line in lines}) >= 2  # groups of several secrets
    reward = {line["episode"]: line["rewards"]["guesser"] for line in lines}
    mean = sum(reward.values()) / len(reward)
    for line in lines:  # every first guess saw the same prompt, whatever its group's secret
        assert line["turn_advantages"]["guesser"]["0"] == pytest.approx(0.5 * (reward[line["episode"]] - mean))
