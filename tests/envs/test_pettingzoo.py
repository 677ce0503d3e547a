"""The PettingZoo adapter, on classic turn-based games with random players (extra `games`)."""
from __future__ import annotations

import pytest

from play import moves, play
from support import write
from orchestrator.envs.pettingzoo_adapter import registry_id
from orchestrator.errors import ConfigError
from orchestrator.team import load_team


def zoo(tmp_path, env: str, players: tuple[str, str] = ("p1", "p2")) -> object:
    pytest.importorskip("pettingzoo")
    path = write(tmp_path / "team.yaml", f"""
        name: zoo
        protocol:
          type: pettingzoo
          env: {env}
          players: [{players[0]}, {players[1]}]
        roles:
          - use: game_player
            name: {players[0]}
          - use: game_player
            name: {players[1]}
        tasks: [{{}}]
        """)
    return load_team(path)


@pytest.mark.parametrize("env,max_turns", [("tictactoe_v3", 9), ("classic/connect_four-v3", 42), ("leduc_holdem_v4", 64),
                                           ("classic/texas_holdem_v4", 64)])
def test_random_players_play_to_the_end(tmp_path, env, max_turns):
    team = zoo(tmp_path, env)
    result = play(team, {"p1": "builtin:random", "p2": "builtin:random"}, tmp_path, episodes=8)
    assert len(result.episodes) == 8
    for ep in result.episodes:
        assert ep.status == "ok" and ep.outcome["reason"] == "game_over" and len(ep.turns) <= max_turns
        totals = ep.outcome["totals"]
        assert ep.rewards == totals and sum(totals.values()) == pytest.approx(0.0)  # zero-sum games
        expected = "draw" if totals["p1"] == totals["p2"] else "win" if totals["p1"] > totals["p2"] else "loss"
        assert ep.outcome["results"]["p1"] == expected


@pytest.mark.parametrize("name", ["texas_holdem_v4", "classic/texas_holdem_v4", "classic/texas_holdem-v4"])
def test_a_game_by_any_of_its_names(tmp_path, name):
    assert registry_id(name) == "classic/texas_holdem-v4"
    assert zoo(tmp_path, name).env_config.env == name  # it loads: PettingZoo made the env to count its agents


def test_an_unknown_game_names_its_registry_id(tmp_path):
    message = r"unknown PettingZoo env 'classic/texas_holdem_v9' \(registry id 'classic/texas_holdem-v9'\)"
    with pytest.raises(ConfigError, match=message):
        zoo(tmp_path, "classic/texas_holdem_v9")


def test_tictactoe_rewards_and_rendering(tmp_path):
    # squares are numbered down the columns: 0 3 6 / 1 4 7 / 2 5 8; p1 takes the top row
    p1, p2 = moves("0", "3", "6"), moves("1", "4")
    (ep,) = play(zoo(tmp_path, "tictactoe_v3"), {"p1": p1, "p2": p2}, tmp_path).episodes
    assert ep.rewards == {"p1": 1.0, "p2": -1.0} and ep.outcome["results"] == {"p1": "win", "p2": "loss"}
    assert p2.requests[1].context["observation"].startswith("Board (X: yours, O: your opponent's):\nO O .\nX . .\n. . .")
    assert p2.requests[1].context["legal_moves"] == ["2", "4", "5", "6", "7", "8"]


def test_a_masked_action_is_illegal(tmp_path):
    (ep,) = play(zoo(tmp_path, "tictactoe_v3"), {"p1": moves("4"), "p2": moves("4")}, tmp_path).episodes
    assert ep.rewards == {"p1": 0.0, "p2": -1.0} and ep.outcome["reason"] == "illegal"


def test_players_must_match_the_agents(tmp_path):
    pytest.importorskip("pettingzoo")
    path = write(tmp_path / "team.yaml", """
        name: zoo
        protocol: {type: pettingzoo, env: tictactoe_v3, players: [solo]}
        roles: [{use: game_player, name: solo}]
        tasks: [{}]
        """)
    with pytest.raises(ConfigError, match="has 2 agents"):
        load_team(path)


def test_an_env_module_that_will_not_import_asks_for_the_path_not_the_extra(tmp_path):
    """A user's game module that is not on the path was met with "pip install 'rolecast[games]'"."""
    with pytest.raises(ConfigError, match=r"cannot import the env module mygames\.pig \(No module named 'mygames'\): "
                                          r"is it on PYTHONPATH\?"):
        zoo(tmp_path, "mygames.pig")


def test_an_env_kwargs_key_the_game_does_not_take_is_one_line(tmp_path):
    """The game's constructor raised TypeError, which pydantic passes on: a traceback at load."""
    pytest.importorskip("pettingzoo")
    path = write(tmp_path / "team.yaml", """
        name: zoo
        protocol: {type: pettingzoo, env: tictactoe_v3, players: [p1, p2], env_kwargs: {boardsize: 4}}
        roles: [{use: game_player, name: p1}, {use: game_player, name: p2}]
        tasks: [{}]
        """)
    with pytest.raises(ConfigError, match=r"team.yaml:2: protocol: tictactoe_v3: .*unexpected keyword argument 'boardsize'"):
        load_team(path)


def test_an_env_module_whose_env_fails_is_one_line(tmp_path, monkeypatch):
    """Only TypeError was worded: a game's missing dependency or a user's failing env() was a traceback at load."""
    pytest.importorskip("pettingzoo")
    write(tmp_path / "zoo_games" / "__init__.py", "")
    write(tmp_path / "zoo_games" / "failing.py", """
        def env(**kwargs):
            raise RuntimeError("the board needs a display")
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"team.yaml:\d+: protocol: zoo_games.failing: RuntimeError: the board needs a display$"):
        zoo(tmp_path, "zoo_games.failing")
