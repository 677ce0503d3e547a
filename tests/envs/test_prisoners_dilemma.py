"""Iterated Prisoner's Dilemma: payoffs per round, configurable payoffs, simultaneity, penalties."""
from __future__ import annotations

from play import Script, any_move, moves, play, team


def test_hand_computed_totals(tmp_path):
    t = team("prisoners_dilemma", rounds=3)
    alice, bob = moves("cooperate", "defect", "defect"), moves("cooperate", "cooperate", "defect")
    (ep,) = play(t, {"alice": alice, "bob": bob}, tmp_path).episodes
    assert ep.rewards == {"alice": 3 + 5 + 1, "bob": 3 + 0 + 1}
    assert ep.outcome["results"] == {"alice": "win", "bob": "loss"}
    assert ep.outcome["history"] == [["cooperate", "cooperate"], ["defect", "cooperate"], ["defect", "defect"]]


def test_configured_payoffs(tmp_path):
    t = team("prisoners_dilemma", rounds=2, payoffs={"temptation": 10, "reward": 6, "punishment": -1, "sucker": -4})
    alice = moves("defect", "defect")
    (ep,) = play(t, {"alice": alice, "bob": moves("cooperate", "defect")}, tmp_path).episodes
    assert ep.rewards == {"alice": 10 - 1, "bob": -4 - 1}
    rules = ("Both cooperate: you each get 6. Both defect: you each get -1. "
             "If you defect while the other cooperates you get 10 and they get -4.")
    assert rules in " ".join(alice.requests[0].messages[-1]["content"].split())  # the rules the players read


def test_second_player_does_not_see_the_current_round(tmp_path):
    alice, bob = moves("defect", "cooperate"), moves("cooperate", "cooperate")
    play(team("prisoners_dilemma", rounds=2), {"alice": alice, "bob": bob}, tmp_path)
    assert bob.requests[0].context["history"] == []
    assert bob.requests[1].context["history"] == [{"round": 1, "you": "cooperate", "opponent": "defect", "payoff": 0.0}]
    assert (alice.requests[1].context["score"], bob.requests[1].context["score"]) == (5.0, 0.0)  # each its own total
    # both moves of a round are that round's: bob's first pick is in round 1, as alice's was
    assert [r.context["round"] for r in alice.requests + bob.requests] == [1, 2, 1, 2]
    assert "opponent played" not in bob.requests[0].messages[-1]["content"]


def test_equal_totals_draw(tmp_path):
    (ep,) = play(team("prisoners_dilemma", rounds=2), {"alice": moves("cooperate", "cooperate"),
                                                       "bob": moves("cooperate", "cooperate")}, tmp_path).episodes
    assert ep.rewards == {"alice": 6.0, "bob": 6.0} and ep.outcome["results"] == {"alice": "draw", "bob": "draw"}


def test_a_total_ahead_by_less_than_one_wins(tmp_path):
    t = team("prisoners_dilemma", rounds=1, payoffs={"temptation": 0.5, "reward": 0.3, "punishment": 0.1, "sucker": 0})
    (ep,) = play(t, {"alice": moves("defect"), "bob": moves("cooperate")}, tmp_path).episodes
    assert ep.rewards == {"alice": 0.5, "bob": 0.0} and ep.outcome["results"] == {"alice": "win", "bob": "loss"}


def test_an_action_not_on_offer_is_illegal(tmp_path):
    (ep,) = play(any_move(team("prisoners_dilemma")), {"alice": moves("cooperate", "betray"), "bob": moves("defect")}, tmp_path).episodes
    assert ep.rewards == {"alice": 0.0 - 1.0, "bob": 5.0}
    assert ep.outcome["results"] == {"alice": "loss", "bob": "win"} and ep.outcome["reason"] == "illegal"


def test_an_invalid_message_ends_the_game_with_the_role_penalty(tmp_path):
    (ep,) = play(team("prisoners_dilemma"), {"alice": Script("C", "C"), "bob": moves()}, tmp_path).episodes
    assert ep.rewards == {"alice": -1.0, "bob": 0.0} and ep.outcome["reason"] == "invalid"


def test_random_players_finish_every_game(tmp_path):
    result = play(team("prisoners_dilemma"), {"alice": "builtin:random", "bob": "builtin:random"}, tmp_path, episodes=20)
    assert len(result.episodes) == 20
    assert all(len(e.turns) == 10 and e.outcome["reason"] == "rounds" for e in result.episodes)
