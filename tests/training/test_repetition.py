"""R-Zero's repetition penalty: a role's reward lowered by the share of the step's other episodes
in which it said the same."""
from __future__ import annotations

import pytest

from orchestrator.training.repetition import penalise_repetition, repetition_shares
from orchestrator.transcript import EpisodeRecord, Turn


def episode(index: int, *contents: dict | None) -> EpisodeRecord:
    ep = EpisodeRecord(id=f"e{index}", index=index, team="t", task={}, seed=0)
    for content in contents:
        ep.turns.append(Turn(len(ep.turns), "proposer", f"m{len(ep.turns)}", content, content is not None, 0, 0.0))
    ep.turns.append(Turn(len(ep.turns), "solver", f"m{len(ep.turns)}", {"answer": 1}, True, 0, 0.0))
    return ep


NINE = {"a": 9, "op": "+", "b": 9}


def test_the_share_of_others_that_said_the_same():
    eps = [episode(0, NINE), episode(1, {"b": 9, "op": "+", "a": 9}), episode(2, NINE), episode(3, {"a": 1, "op": "+", "b": 2}),
           episode(4, None)]
    # key order does not make a message new; an invalid turn is neither a repeat nor repeated
    assert repetition_shares(eps, "proposer") == [0.5, 0.5, 0.5, 0.0, None]
    assert repetition_shares([episode(0, NINE, NINE), episode(1, NINE)], "proposer") == [0.0, 0.0]  # the whole turn list counts


def test_rewards_fall_by_lambda_times_the_share_and_only_for_the_penalised_role():
    groups = [[episode(0, NINE), episode(1, NINE)], [episode(2, NINE), episode(3, {"a": 5, "op": "*", "b": 7})]]
    rewards = [[{"proposer": 0.0, "solver": 1.0}] * 2, [{"proposer": 0.0, "solver": 1.0}, {"proposer": 0.75, "solver": 0.25}]]
    out, metrics = penalise_repetition(groups, rewards, {"proposer": 0.6})
    # three of four said 9 + 9: each shares it with two of its three others, across groups (the step)
    assert [rw["proposer"] for g in out for rw in g] == pytest.approx([-0.4, -0.4, -0.4, 0.75])
    assert [rw["solver"] for g in out for rw in g] == [1.0, 1.0, 1.0, 0.25]
    assert metrics == {"proposer/repeated": pytest.approx(0.5)}
    assert rewards[0][0]["proposer"] == 0.0  # the input is not changed
    assert penalise_repetition(groups, rewards, {}) == (rewards, {})


def test_a_failed_episode_is_not_among_the_n_nor_a_repeat_and_an_invalid_one_is_in_no_mean():
    failed = episode(2, NINE)
    failed.status = "error"
    groups = [[episode(0, NINE), episode(1, NINE)], [failed, episode(3, None)]]
    rewards = [[{"proposer": 0.0, "solver": 1.0}] * 2] * 2
    assert repetition_shares([ep for g in groups for ep in g], "proposer") == [0.5, 0.5, None, None]  # one of 2 others
    out, metrics = penalise_repetition(groups, rewards, {"proposer": 0.6})
    assert [rw["proposer"] for g in out for rw in g] == pytest.approx([-0.3, -0.3, 0.0, 0.0])
    assert metrics == {"proposer/repeated": pytest.approx(0.5)}  # over the episodes where it said something


def test_a_step_with_one_speaker_or_none_is_not_penalised_and_has_no_mean():
    """A step where every proposer turn was invalid (early in training) divided by zero for the
    mean, as one where only one episode finished did for the share."""
    failed = episode(1, NINE)
    failed.status = "error"
    rewards = [[{"proposer": 0.5, "solver": 1.0}] * 2]
    assert penalise_repetition([[episode(0, None), episode(1, None)]], rewards, {"proposer": 0.6}) == (rewards, {})
    assert repetition_shares([episode(0, NINE), failed], "proposer") == [0.0, None]


def test_the_mean_share_keeps_four_decimals():
    eps = [episode(0, NINE), episode(1, NINE), episode(2, {"a": 1, "op": "+", "b": 2}), episode(3, None)]
    rewards = [[{"proposer": 0.0, "solver": 1.0}] * 4]
    assert penalise_repetition([eps], rewards, {"proposer": 1.0})[1] == {"proposer/repeated": 0.2222}  # (1/3 + 1/3 + 0) / 3
