"""Tic-Tac-Toe: minimax against random, hand-computed games, illegal and invalid moves, views."""
from __future__ import annotations

import pytest
from play import ROOT, Script, any_move, moves, no_move_field, play, team

from orchestrator.errors import ConfigError
from orchestrator.team import load_team


def test_minimax_never_loses_to_random_in_200_games(tmp_path):
    t = team("tictactoe")
    as_x = play(t, {"x": "builtin:minimax", "o": "builtin:random"}, tmp_path, episodes=100).episodes
    as_o = play(t, {"x": "builtin:random", "o": "builtin:minimax"}, tmp_path, episodes=100, seed=1).episodes
    assert len(as_x) == len(as_o) == 100 and all(e.status == "ok" for e in as_x + as_o)
    assert all(e.outcome["results"]["x"] != "loss" for e in as_x)
    assert all(e.outcome["results"]["o"] != "loss" for e in as_o)
    assert sum(e.outcome["results"]["x"] == "win" for e in as_x) > 80  # it also wins


def test_minimax_against_itself_always_draws(tmp_path):
    episodes = play(team("tictactoe"), {"x": "builtin:minimax", "o": "builtin:minimax"}, tmp_path, episodes=10).episodes
    assert len(episodes) == 10
    assert all(e.outcome["results"] == {"x": "draw", "o": "draw"} and e.rewards == {"x": 0.0, "o": 0.0} for e in episodes)


def test_a_won_game(tmp_path):
    (ep,) = play(team("tictactoe"), {"x": moves("a1", "b1", "c1"), "o": moves("a2", "b2")}, tmp_path).episodes
    assert ep.rewards == {"x": 1.0, "o": -1.0}
    assert ep.outcome == {"results": {"x": "win", "o": "loss"}, "reason": "line"}
    assert [t.role for t in ep.turns] == ["x", "o", "x", "o", "x"]


ROWS = [["a1", "b1", "c1"], ["a2", "b2", "c2"], ["a3", "b3", "c3"]]
COLUMNS = [list(column) for column in zip(*ROWS)]


@pytest.mark.parametrize("line", ROWS + COLUMNS + [["a1", "b2", "c3"], ["c1", "b2", "a3"]])
def test_every_line_wins(tmp_path, line):
    """Each of the 8 lines ends the game for its mover (minimax reads the env's list of lines, so
    its games against random could not tell one left out)."""
    o = [cell for row in ROWS for cell in row if cell not in line][:2]  # two moves: O cannot finish a line first
    (ep,) = play(team("tictactoe"), {"x": moves(*line), "o": moves(*o)}, tmp_path).episodes
    assert ep.outcome == {"results": {"x": "win", "o": "loss"}, "reason": "line"} and len(ep.turns) == 5


def test_a_line_made_by_the_move_that_fills_the_board_wins(tmp_path):
    # X O X / O X O / X O X: X's ninth move, b2, fills the board and makes both diagonals
    x, o = moves("a1", "c1", "a3", "c3", "b2"), moves("b1", "a2", "c2", "b3")
    (ep,) = play(team("tictactoe"), {"x": x, "o": o}, tmp_path).episodes
    assert len(ep.turns) == 9 and ep.rewards == {"x": 1.0, "o": -1.0}
    assert ep.outcome == {"results": {"x": "win", "o": "loss"}, "reason": "line"}


def test_the_anti_diagonal_wins_and_a_move_is_read_spaced_in_any_case(tmp_path):
    t = any_move(team("tictactoe"))  # the recipe's enum would refuse " C1" before the env
    (ep,) = play(t, {"x": moves(" C1", "b2 ", "A3"), "o": moves("a1", "b1")}, tmp_path).episodes
    assert ep.outcome == {"results": {"x": "win", "o": "loss"}, "reason": "line"} and len(ep.turns) == 5


def test_a_drawn_game_with_configured_rewards(tmp_path):
    t = team("tictactoe", rewards={"win": 2.0, "loss": -3.0, "draw": 0.5})
    # X O X / X O O / O X X
    x, o = moves("a1", "c1", "a2", "c3", "b3"), moves("b1", "b2", "c2", "a3")
    (ep,) = play(t, {"x": x, "o": o}, tmp_path).episodes
    assert ep.rewards == {"x": 0.5, "o": 0.5} and ep.outcome["reason"] == "full"


def test_an_occupied_square_is_illegal_penalised_and_ends_the_game(tmp_path):
    t = any_move(team("tictactoe", illegal_penalty=-2.0))  # the recipe's enum would refuse "B2 " before the env
    (ep,) = play(t, {"x": moves("b2", "a1"), "o": moves("B2 ")}, tmp_path).episodes
    assert len(ep.turns) == 2 and ep.rewards == {"x": 0.0, "o": -2.0}
    assert ep.outcome == {"results": {"x": "win", "o": "loss"}, "reason": "illegal"}


def test_an_unknown_square_is_illegal(tmp_path):
    (ep,) = play(any_move(team("tictactoe")), {"x": moves("d4"), "o": moves()}, tmp_path).episodes
    assert ep.rewards == {"x": -1.0, "o": 0.0} and ep.outcome["reason"] == "illegal"
    assert ep.took_part == ["x", "o"]  # o's win is paid, 0: its mean reward is over the games its wins count in


def test_an_unparseable_move_costs_the_invalid_penalty_and_ends_the_game(tmp_path):
    # game_player: max_retries 1, invalid_penalty -1.0 (the role default); the env adds nothing
    (ep,) = play(team("tictactoe"), {"x": moves("a1"), "o": Script("b2 please", "b2!")}, tmp_path).episodes
    assert [t.valid for t in ep.turns] == [True, False]
    assert ep.rewards == {"x": 0.0, "o": -1.0}
    assert ep.outcome == {"results": {"x": "win", "o": "loss"}, "reason": "invalid"}


def test_each_player_sees_its_own_side_and_both_sample_the_shared_adapter(tmp_path):
    x, o = moves("a1", "b1", "c1"), moves("a2", "b2")
    play(team("tictactoe"), {"x": x, "o": o}, tmp_path)
    assert {r.context["mark"] for r in x.requests} == {"X"} and {r.context["mark"] for r in o.requests} == {"O"}
    assert "You play O" in o.requests[0].messages[-1]["content"]
    assert o.requests[0].context["board"] == ["X"] + ["."] * 8
    assert o.requests[0].context["moves"] == [{"role": "x", "mark": "X", "move": "a1"}]
    assert o.requests[0].context["legal_moves"] == ["b1", "c1", "a2", "b2", "c2", "a3", "b3", "c3"]
    assert {r.adapter for r in x.requests + o.requests} == {"player"}


def test_fewer_max_turns_than_a_full_board_are_refused_at_load(tmp_path):
    """A drawn game takes 9 moves: under max_turns 8 it stopped at max_turns, with no result."""
    path = tmp_path / "ttt.yaml"
    path.write_text((ROOT / "recipes" / "tictactoe.yaml").read_text() + "max_turns: 8\n")
    with pytest.raises(ConfigError, match="a whole game can take 9 turns and max_turns is 8"):
        load_team(path)
    path.write_text((ROOT / "recipes" / "tictactoe.yaml").read_text() + "max_turns: 9\n")
    assert load_team(path).config.max_turns == 9  # exactly a full board's


def test_the_second_player_is_the_default_opponent_and_players_are_different_roles():
    from orchestrator.envs.tictactoe import TicTacToeConfig

    assert TicTacToeConfig(players=["x", "o"]).opponent_role() == "o"
    assert TicTacToeConfig(players=["x", "o"], opponent="x").opponent_role() == "x"
    with pytest.raises(ValueError, match="players must be different roles"):
        TicTacToeConfig(players=["x", "x"])
    with pytest.raises(ValueError, match=r"opponent 'z' is not one of this game's roles \['x', 'o'\]"):
        TicTacToeConfig(players=["x", "o"], opponent="z")


def test_a_player_whose_schema_has_no_move_is_refused_at_load(tmp_path):
    """An own role whose move is ``{"square": "b2"}`` loaded, then lost every game on its first turn, as illegal."""
    with pytest.raises(ConfigError, match=r"team.yaml:2: protocol: TicTacToeEnv reads field\(s\) move of the messages of role "
                                          r"'p0', which its output_schema does not declare \(properties: square\)"):
        load_team(no_move_field(tmp_path, "{type: tictactoe, players: [p0, p1]}"))
