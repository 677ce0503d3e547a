"""Rock-Paper-Scissors: per-round rewards, totals, configured rewards, illegal moves."""
from __future__ import annotations

import pytest

from play import any_move, moves, no_move_field, play, team
from orchestrator.errors import ConfigError
from orchestrator.team import load_team
from support import write


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


def test_more_rounds_than_max_turns_allows_are_refused_at_load(tmp_path):
    """40 rounds are 80 turns: under the default max_turns (64) every episode stopped with no result."""
    path = write(tmp_path / "team.yaml", """
        name: rps
        protocol: {type: rps, players: [alice, bob], rounds: 40}
        roles: [{use: game_player, name: alice}, {use: game_player, name: bob}]
        tasks: [{}]
        """)
    with pytest.raises(ConfigError, match=r"team.yaml:2: protocol: a whole game can take 80 turns and max_turns is 64"):
        load_team(path)
    path.write_text(path.read_text() + "max_turns: 80\n")
    assert load_team(path).env_config.rounds == 40


@pytest.mark.parametrize("protocol", ["rps", "prisoners_dilemma"])
def test_a_player_whose_schema_has_no_move_is_refused_at_load(tmp_path, protocol):
    """An own role whose action is ``{"square": "rock"}`` loaded, then lost every game on its first turn, as illegal."""
    with pytest.raises(ConfigError, match=r"team.yaml:2: protocol: \w+Env reads field\(s\) move of the messages of role 'p0'"):
        load_team(no_move_field(tmp_path, f"{{type: {protocol}, players: [p0, p1]}}"))
