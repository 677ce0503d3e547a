"""Guess the Number: binary search within its bound, hand-computed rewards, penalties."""
from __future__ import annotations

import dataclasses
import math

import pytest

from play import Script, play, team
from orchestrator.policies.baselines import next_guess


def small(tasks: list[dict] | None = None, **protocol):
    """1..16 in 5 guesses with the role's own schema (any integer): out-of-range guesses reach the env.
    (recipes/guess_number.yaml puts the range in the schema, so constrained decoding stays inside it.)"""
    return team("guess_number_classic", tasks, **{"low": 1, "high": 16, "turns": 5, **protocol})


def guesses(*values: int) -> Script:
    return Script(*({"guess": v} for v in values))


@pytest.mark.parametrize("low,high", [(1, 16), (1, 100), (0, 1)])
def test_binary_search_always_wins_within_its_bound(tmp_path, low, high):
    bound = math.ceil(math.log2(high - low + 2))  # k guesses separate 2**k - 1 numbers
    t = small(tasks=[{"secret": s} for s in range(low, high + 1)], low=low, high=high, turns=bound)
    result = play(t, {"guesser": "builtin:binary-search"}, tmp_path, episodes=high - low + 1)
    assert all(e.outcome["results"] == {"guesser": "win"} for e in result.episodes)
    assert all(e.rewards["guesser"] == 1.0 and len(e.turns) <= bound for e in result.episodes)
    assert max(len(e.turns) for e in result.episodes) == bound


def test_classic_range_needs_eleven_guesses_for_two_numbers():
    """0..1024 is 1025 numbers: binary search finds all but two within the classic 10 turns."""
    def turns_needed(secret: int) -> int:
        history: list[dict] = []
        while True:
            g = next_guess(0, 1024, history)
            history.append({"guess": g, "feedback": "correct" if g == secret else "too high" if g > secret else "too low"})
            if g == secret:
                return len(history)

    needed = [turns_needed(s) for s in range(1025)]
    assert max(needed) == 11 and sum(n > 10 for n in needed) == 2


def test_feedback_and_reward_of_a_won_game(tmp_path):
    script = guesses(8, 4, 6, 5)
    result = play(small(tasks=[{"secret": 5}]), {"guesser": script}, tmp_path)
    (ep,) = result.episodes
    assert ep.rewards == {"guesser": 1.0}
    assert [h["feedback"] for h in script.requests[-1].context["history"]] == ["too high", "too low", "too high"]
    assert [r.context["feedback"] for r in script.requests] == [None, "too high", "too low", "too high"]
    assert ep.outcome == {"results": {"guesser": "win"}, "reason": "correct", "secret": 5, "guesses": 4,
                          "process": {"guesser": 1.0}}  # every guess inside what the feedback allowed


def test_running_out_of_turns_pays_failed(tmp_path):
    t = small(tasks=[{"secret": 16}], rewards={"correct": 1.0, "failed": -0.25})
    (ep,) = play(t, {"guesser": guesses(1, 2, 3, 4, 5, 6)}, tmp_path).episodes
    assert len(ep.turns) == 5 and ep.rewards == {"guesser": -0.25}
    assert [t.score for t in ep.turns] == [1.0] * 5  # the last guess scored too, as it ends the game
    assert ep.outcome["results"] == {"guesser": "loss"} and ep.outcome["reason"] == "turns"


def test_unparseable_turn_costs_the_invalid_penalty_and_a_turn(tmp_path):
    # number_guesser: max_retries 1 (two attempts), invalid_penalty -0.5; on_invalid: continue
    script = Script("Guess: 5", "five", {"guess": 5})
    (ep,) = play(small(tasks=[{"secret": 5}]), {"guesser": script}, tmp_path).episodes
    assert [t.valid for t in ep.turns] == [False, True] and ep.turns[0].retries == 1
    assert ep.rewards == {"guesser": -0.5 + 1.0}
    assert script.requests[-1].context["history"] == [{"guess": None, "feedback": "invalid"}]
    assert script.requests[-1].context["turns_left"] == 4


def test_unparseable_turn_ends_the_game_with_on_invalid_end(tmp_path):
    t = small(tasks=[{"secret": 5}], on_invalid="end")
    (ep,) = play(t, {"guesser": Script("?", "?")}, tmp_path).episodes
    assert ep.rewards == {"guesser": -0.5} and ep.outcome["results"] == {"guesser": "loss"}


def test_out_of_range_guess_is_illegal_and_ends_the_game(tmp_path):
    (ep,) = play(small(tasks=[{"secret": 5}]), {"guesser": guesses(3, 17)}, tmp_path).episodes
    assert len(ep.turns) == 2 and ep.rewards == {"guesser": -1.0}
    assert ep.outcome["reason"] == "illegal" and ep.outcome["results"] == {"guesser": "loss"}


def test_a_boolean_guess_is_illegal_not_one(tmp_path):
    # JSON true is no integer, though Python's bool is an int: a schema that lets it through must not make it 1
    t = small(tasks=[{"secret": 1}])
    t = dataclasses.replace(t, roles={n: dataclasses.replace(r, schema={"type": "object"}) for n, r in t.roles.items()})
    (ep,) = play(t, {"guesser": guesses(True)}, tmp_path).episodes
    assert ep.outcome["reason"] == "illegal" and ep.rewards == {"guesser": -1.0}


def test_a_range_of_one_number_is_refused():
    with pytest.raises(ValueError, match=r"high \(5\) must be greater than low \(5\)"):
        small(low=5, high=5)


def test_an_illegal_guess_counts_in_the_process_mean(tmp_path):
    # 8 halves 1..16 (1.0), 17 is illegal (0.0): the mean of the two turns, not of the first alone
    (ep,) = play(small(tasks=[{"secret": 5}], process="halving"), {"guesser": guesses(8, 17)}, tmp_path).episodes
    assert [turn.score for turn in ep.turns] == [1.0, 0.0]
    assert ep.outcome["process"] == {"guesser": 0.5} and ep.outcome["guesses"] == 2


def test_secrets_come_from_the_seed_when_tasks_have_none(tmp_path):
    t = small()
    a = [e.outcome["secret"] for e in play(t, {"guesser": "builtin:random"}, tmp_path, episodes=20).episodes]
    b = [e.outcome["secret"] for e in play(t, {"guesser": "builtin:random"}, tmp_path, episodes=20).episodes]
    assert a == b and len(set(a)) > 5 and all(1 <= s <= 16 for s in a)


def test_drawn_secrets_reach_both_ends_of_the_range(tmp_path):
    t = small(low=0, high=1)
    secrets = {e.outcome["secret"] for e in play(t, {"guesser": "builtin:random"}, tmp_path, episodes=20).episodes}
    assert secrets == {0, 1}


def test_a_task_secret_of_zero_is_kept_not_drawn(tmp_path):
    t = small(tasks=[{"secret": 0}], low=-8, high=8)
    result = play(t, {"guesser": "builtin:binary-search"}, tmp_path, episodes=8)
    assert all(e.outcome["secret"] == 0 and e.outcome["reason"] == "correct" for e in result.episodes)


def test_random_guesses_stay_in_range(tmp_path):
    t = small(tasks=[{"secret": s} for s in range(3, 10)], low=3, high=9, turns=50)
    result = play(t, {"guesser": "builtin:random"}, tmp_path, episodes=20)
    assert len(result.episodes) == 20
    assert all(e.outcome["reason"] == "correct" for e in result.episodes)  # never illegal


def test_the_recipe_schema_makes_an_out_of_range_guess_a_retry(tmp_path):
    (ep,) = play(team("guess_number", tasks=[{"secret": 5}]), {"guesser": guesses(17, 5)}, tmp_path).episodes
    assert ep.turns[0].retries == 1 and ep.turns[0].valid and ep.rewards == {"guesser": 1.0}
    assert "17 is greater than the maximum of 16" in ep.turns[0].attempts[0].errors[0]


def test_lowest_and_highest_restate_the_feedback(tmp_path):
    script = guesses(8, 4, 6, 5)
    play(small(tasks=[{"secret": 5}]), {"guesser": script}, tmp_path)
    seen = [(r.context["lowest"], r.context["highest"]) for r in script.requests]
    assert seen == [(1, 16), (1, 7), (5, 7), (5, 5)]


def test_process_reward_is_the_share_of_guesses_the_feedback_allowed(tmp_path):
    # secret 5: 8 (ok), 12 (8 was too high: not), invalid (not), 5 (ok) -> 2 of 4
    script = Script({"guess": 8}, {"guess": 12}, "?", "?", {"guess": 5})
    (ep,) = play(small(tasks=[{"secret": 5}]), {"guesser": script}, tmp_path).episodes
    assert ep.outcome["process"] == {"guesser": 0.5} and ep.outcome["reason"] == "correct"
    from plugins.rewards import hybrid_reward
    config = hybrid_reward.Config(alpha=0.6)
    # R is the secret found (1), the invalid turn's -0.5 the guesser's own, in full
    assert hybrid_reward(ep, ["guesser"], config) == {"guesser": pytest.approx(0.6 * 1.0 + 0.4 * 0.5 - 0.5)}


@pytest.mark.parametrize("process, scores", [("halving", [1.0, 1.0, 0.5, 1.0]), ("consistent", [1.0, 1.0, 1.0, 1.0])])
def test_guess_number_scores_each_guess(tmp_path, process, scores):
    t = small(tasks=[{"secret": 5}], process=process)
    # 1..16: 8 halves it (too high); 1..7: 4 rules out 4 of 7 as the midpoint does (too low);
    # 5..7: 7 rules out one number where 6 would rule out two (too high); 5..6: 5 is a midpoint
    (ep,) = play(t, {"guesser": guesses(8, 4, 7, 5)}, tmp_path).episodes
    assert [turn.score for turn in ep.turns] == scores
    assert ep.outcome["process"] == {"guesser": pytest.approx(sum(scores) / 4)}


def test_guess_number_halving_score_at_the_edges(tmp_path):
    t = small(tasks=[{"secret": 16}], process="halving")
    (ep,) = play(t, {"guesser": Script({"guess": 1}, {"guess": 1}, "no guess", "still none", {"guess": 17})},
                 tmp_path).episodes
    # an edge of 16 rules out 1 where the midpoint rules out 8; a guess the feedback already ruled
    # out scores 0; an invalid turn has no score; an illegal guess scores 0 and ends the game
    assert [turn.score for turn in ep.turns] == [0.125, 0.0, None, 0.0]


def test_a_guesser_whose_schema_has_no_guess_is_refused_at_load(tmp_path):
    """A role of another shape ({"number": 8}) loaded, then lost every game on its first turn, as illegal."""
    from play import ROOT

    from orchestrator.errors import ConfigError
    from orchestrator.team import load_team

    recipe = (ROOT / "recipes/guess_number.yaml").read_text()
    (tmp_path / "team.yaml").write_text(recipe.replace("{guess: {type", "{number: {type").replace("[guess]", "[number]"))
    with pytest.raises(ConfigError, match=r"GuessNumberEnv reads field\(s\) guess of the messages of role 'guesser'"):
        load_team(tmp_path / "team.yaml")


def test_binary_search_guesses_the_middle_of_what_the_feedback_leaves_open():
    """A guess the feedback rules out is no longer open: after "9 is too high" in 1..16 it is 1..8."""
    assert next_guess(1, 16, [{"guess": 9, "feedback": "too high"}]) == 4
    assert next_guess(1, 16, [{"guess": 4, "feedback": "too low"}, {"guess": 12, "feedback": "too high"}]) == 8
