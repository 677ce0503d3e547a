"""The TextArena adapter, on TextArena's own games with random players (extra `games`)."""
from __future__ import annotations

import pytest

from play import moves, play
from orchestrator.envs.game import require
from orchestrator.envs.textarena_adapter import listed_moves
from support import write
from orchestrator.team import load_team


def arena(tmp_path, env_id: str, extra: str = "") -> object:
    pytest.importorskip("textarena")
    path = write(tmp_path / "team.yaml", f"""
        name: arena
        protocol:
          type: textarena
          env_id: {env_id}
          players: [p0, p1]
          opponent: p1
          {extra}
        roles:
          - use: game_player
            name: p0
          - use: game_player
            name: p1
        tasks: [{{}}]
        """)
    return load_team(path)


def test_a_missing_suite_names_the_extra():
    with pytest.raises(ValueError, match=r"pip install 'rolecast\[games\]'"):
        require("textarena_not_installed_here")


def test_moves_listed_in_the_observation():
    text = "Board...\nAvailable Moves: '[0]', '[4]'\n[Player 0] [1]\nAvailable Moves: '[2]', '[8]'"
    assert listed_moves(text) == ["[2]", "[8]"] and listed_moves("no list") == []


def test_tictactoe_random_players_play_to_the_end(tmp_path):
    team = arena(tmp_path, "TicTacToe-v0")
    result = play(team, {"p0": "builtin:random", "p1": "builtin:random"}, tmp_path, episodes=6)
    for ep in result.episodes:
        assert ep.status == "ok" and ep.outcome["reason"] == "game_over"
        assert 5 <= len(ep.turns) <= 9 and all(t.valid for t in ep.turns)
        results, rewards = ep.outcome["results"], ep.rewards
        assert sorted(results.values()) in (["draw", "draw"], ["loss", "win"])
        winner = [p for p, r in results.items() if r == "win"]
        assert not winner or rewards[winner[0]] > min(rewards.values())


def test_rock_paper_scissors_with_configured_moves(tmp_path):
    team = arena(tmp_path, "IteratedRockPaperScissors-v0", 'moves: ["[rock]", "[paper]", "[scissors]"]')
    result = play(team, {"p0": "builtin:random", "p1": "builtin:random"}, tmp_path, episodes=3)
    assert all(e.status == "ok" and len(e.turns) == 18 and e.outcome["results"] for e in result.episodes)


def test_textarena_judges_its_own_invalid_moves(tmp_path):
    team = arena(tmp_path, "TicTacToe-v0")
    (ep,) = play(team, {"p0": moves("[4]", "[4]", "[4]", "[4]"), "p1": moves("[4]", "[4]", "[4]")}, tmp_path).episodes
    assert ep.status == "ok" and ep.outcome["reason"] == "game_over"
    assert ep.outcome["results"]["p1"] == "loss"
