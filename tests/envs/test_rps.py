"""Rock-Paper-Scissors: per-round rewards, totals, configured rewards, illegal moves."""
from __future__ import annotations

from play import any_move, moves, play, team


def test_hand_computed_rounds(tmp_path):
    alice, bob = moves("rock", "paper", "scissors"), moves("scissors", "paper", "rock")
    (ep,) = play(team("rps"), {"alice": alice, "bob": bob}, tmp_path).episodes
    assert [t.reward for t in ep.turns] == [0.0, -1.0, 0.0, 0.0, 0.0, 1.0]  # paid on the second mover's turn
    assert ep.rewards == {"alice": 0.0, "bob": 0.0}
    assert ep.outcome["results"] == {"alice": "draw", "bob": "draw"}


def test_configured_rewards_and_winner(tmp_path):
    t = team("rps", rounds=2, rewards={"win": 2.0, "loss": -0.5, "draw": 0.25})
    (ep,) = play(t, {"alice": moves("paper", "rock"), "bob": moves("rock", "rock")}, tmp_path).episodes
    assert ep.rewards == {"alice": 2.25, "bob": -0.25}
    assert ep.outcome["results"] == {"alice": "win", "bob": "loss"}


def test_an_unknown_action_is_illegal(tmp_path):
    (ep,) = play(any_move(team("rps")), {"alice": moves("lizard"), "bob": moves()}, tmp_path).episodes
    assert ep.rewards == {"alice": -1.0, "bob": 0.0} and ep.outcome["reason"] == "illegal"


def test_random_players_use_the_three_actions(tmp_path):
    result = play(team("rps", rounds=10), {"alice": "builtin:random", "bob": "builtin:random"}, tmp_path, episodes=5)
    played = {a for e in result.episodes for pair in e.outcome["history"] for a in pair}
    assert played == {"rock", "paper", "scissors"}
