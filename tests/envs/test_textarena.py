"""The TextArena adapter, on TextArena's own games with random players (extra `games`)."""
from __future__ import annotations

import asyncio
import copy
import json
import random
import re

import numpy as np
import pytest

from play import Script, moves, no_move_field, play
from orchestrator.envs.game import require
from orchestrator.errors import ConfigError
from orchestrator.envs.textarena_adapter import listed_moves, start, state_moves
from support import write
from orchestrator.team import load_team

RANDOM = {"p0": "builtin:random", "p1": "builtin:random"}


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


def test_an_env_kwargs_key_the_game_does_not_take_is_refused_at_load(tmp_path):
    """It passed `validate`, then failed every episode."""
    with pytest.raises(ConfigError, match=r"team.yaml:\d+: protocol: TicTacToe-v0: .*unexpected keyword argument 'boardsize'"):
        arena(tmp_path, "TicTacToe-v0", "env_kwargs: {boardsize: 4}")


def test_a_variant_without_observation_wrappers_is_refused_at_load(tmp_path):
    """TicTacToe-v0-raw observes a list of messages, not text: it loaded, then every episode failed on
    AttributeError: 'list' object has no attribute 'strip'."""
    with pytest.raises(ConfigError, match=r"team.yaml:\d+: protocol: TicTacToe-v0-raw observes a list, not text "
                                          r"\(no TextArena observation wrapper\): use TicTacToe-v0$"):
        arena(tmp_path, "TicTacToe-v0-raw")


def test_an_illegal_penalty_is_refused_at_load(tmp_path):
    """TextArena pays its invalid moves itself: an illegal_penalty of -5 loaded and the mover still got -1."""
    with pytest.raises(ConfigError, match=r"team.yaml:\d+: protocol: illegal_penalty is not used here: "
                                          r"TextArena judges invalid moves and pays them its own rewards$"):
        arena(tmp_path, "TicTacToe-v0", "illegal_penalty: -5")


def three_players(tmp_path, env_id: str):
    pytest.importorskip("textarena")
    return write(tmp_path / "team.yaml", f"""
        name: arena
        protocol: {{type: textarena, env_id: {env_id}, players: [p0, p1, p2]}}
        roles: [{{use: game_player, name: p0}}, {{use: game_player, name: p1}}, {{use: game_player, name: p2}}]
        tasks: [{{}}]
        """)


def test_a_player_count_the_game_refuses_is_refused_at_load(tmp_path):
    """TicTacToe-v0 with three players loaded, then every episode failed on TextArena's assertion."""
    path = three_players(tmp_path, "TicTacToe-v0")
    with pytest.raises(ConfigError, match=r"team.yaml:2: protocol: TicTacToe-v0 with 3 players failed to start: "
                                          r"AssertionError: The number of players has to be 2, received 3$"):
        load_team(path)


def test_moves_listed_in_the_observation():
    text = "Board...\nAvailable Moves: '[0]', '[4]'\n[Player 0] [1]\nAvailable Moves: '[2]', '[8]'"
    assert listed_moves(text) == ["[2]", "[8]"] and listed_moves("no list") == []


def alternating(ep) -> bool:
    """Each turn passes to the other player: TextArena asked no one to retry an invalid move."""
    return [t.role for t in ep.turns] == [("p0", "p1")[i % 2] for i in range(len(ep.turns))]


def test_tictactoe_random_players_play_to_the_end(tmp_path):
    result = play(arena(tmp_path, "TicTacToe-v0"), RANDOM, tmp_path, episodes=6)
    assert len(result.episodes) == 6
    for ep in result.episodes:
        assert ep.status == "ok" and ep.outcome["reason"] == "game_over" and ep.outcome["invalid_move"] == []
        assert 5 <= len(ep.turns) <= 9 and all(t.valid for t in ep.turns) and alternating(ep)
        results, rewards = ep.outcome["results"], ep.rewards
        if rewards["p0"] == rewards["p1"]:  # a draw fills the board
            assert results == {"p0": "draw", "p1": "draw"} and len(ep.turns) == 9
        else:
            winner = max(rewards, key=rewards.get)
            assert results[winner] == "win" and ep.turns[-1].role == winner  # the last move made the line


def test_each_player_sees_its_own_player_id(tmp_path):
    p0, p1 = moves("[0]", "[1]", "[2]"), moves("[3]", "[4]")
    (ep,) = play(arena(tmp_path, "TicTacToe-v0"), {"p0": p0, "p1": p1}, tmp_path).episodes
    assert ep.outcome["results"] == {"p0": "win", "p1": "loss"}  # the top row
    assert [r.context["player_id"] for r in p0.requests] == [0, 0, 0]
    assert [r.context["player_id"] for r in p1.requests] == [1, 1]


def test_rock_paper_scissors_with_configured_moves(tmp_path):
    team = arena(tmp_path, "IteratedRockPaperScissors-v0", 'moves: ["[rock]", "[paper]", "[scissors]"]')
    result = play(team, RANDOM, tmp_path, episodes=3)
    assert len(result.episodes) == 3
    for ep in result.episodes:
        assert ep.status == "ok" and len(ep.turns) == 18 and ep.outcome["invalid_move"] == []
        assert {t.content["move"] for t in ep.turns} <= {"[rock]", "[paper]", "[scissors]"}
        assert sorted(ep.outcome["results"].values()) in (["draw", "draw"], ["loss", "win"])


def test_random_players_play_nim_by_the_rules(tmp_path):
    result = play(arena(tmp_path, "Nim-v0"), RANDOM, tmp_path, episodes=5)
    assert len(result.episodes) == 5
    for ep in result.episodes:
        piles = [3, 4, 5]  # Nim-v0's
        for turn in ep.turns:
            pile, taken = map(int, turn.content["move"].strip("[]").split())
            assert 1 <= taken <= piles[pile]
            piles[pile] -= taken
        assert piles == [0, 0, 0] and alternating(ep) and ep.outcome["invalid_move"] == []
        last = ep.turns[-1].role
        assert ep.outcome["results"][last] == "win" and ep.outcome["detail"].endswith("took the last object(s)!")


def test_a_one_player_game_is_won_only_when_solved(tmp_path):
    """TextArena pays a one-player game the share done (here 0.5 for a guess one off): that was a win."""
    pytest.importorskip("textarena")
    path = write(tmp_path / "team.yaml", """
        name: arena
        protocol: {type: textarena, env_id: GuessTheNumber-v0, players: [p0],
                   env_kwargs: {min_number: 1, max_number: 3, max_turns: 1}}
        roles: [{use: game_player, name: p0}]
        tasks: [{}]
        """)
    result = play(load_team(path), {"p0": moves("[1]", "[1]")}, tmp_path, episodes=6)
    rewards = [ep.rewards["p0"] for ep in result.episodes]
    assert 0.5 in rewards and 1.0 in rewards  # a near miss and a hit among them
    assert [ep.outcome["results"]["p0"] for ep in result.episodes] == ["win" if r == 1.0 else "loss" for r in rewards]


def test_the_winning_side_of_three_players_wins(tmp_path):
    """TextArena pays each winner +1: two winners against one loser were both called a draw."""
    path = three_players(tmp_path, "ThreePlayerTicTacToe-v0")
    (ep,) = play(load_team(path), {"p0": moves("pass", "pass"), "p1": moves(), "p2": moves()}, tmp_path).episodes
    assert ep.rewards == {"p0": -1.0, "p1": 1.0, "p2": 1.0} and ep.outcome["invalid_move"] == ["p0"]
    assert ep.outcome["results"] == {"p0": "loss", "p1": "win", "p2": "win"}


def test_players_knocked_out_in_turn_lose_to_the_last_one_standing(tmp_path):
    """Liar's Dice with three: each invalid move twice knocks its player out and the game goes on; the
    second out is paid 0 but lost all the same (the results compare scores, not signs)."""
    path = three_players(tmp_path, "LiarsDice-v0")
    (ep,) = play(load_team(path), {"p0": moves("x", "x"), "p1": moves("x", "x"), "p2": moves()}, tmp_path).episodes
    assert [t.role for t in ep.turns] == ["p0", "p0", "p1", "p1"] and ep.outcome["invalid_move"] == ["p0", "p1"]
    assert ep.rewards == {"p0": -1.0, "p1": 0.0, "p2": 1.0}
    assert ep.outcome["results"] == {"p0": "loss", "p1": "loss", "p2": "win"}


def test_an_invalid_message_forfeits_at_once(tmp_path):
    """No JSON (twice, with the retry): the role loses there, TextArena is not sent an empty move."""
    p0 = Script("no move", "none")
    (ep,) = play(arena(tmp_path, "TicTacToe-v0"), {"p0": p0, "p1": moves()}, tmp_path).episodes
    assert ep.outcome["reason"] == "invalid" and ep.outcome["results"] == {"p0": "loss", "p1": "win"}
    assert len(ep.turns) == 1 and ep.rewards == {"p0": -1.0, "p1": 0.0}


async def roll(request) -> str:
    await asyncio.sleep(0)  # the episodes interleave here, as they do at a model's reply
    return json.dumps({"move": "[roll]"})


def test_a_seed_rolls_the_same_dice_at_any_concurrency(tmp_path):
    """Pig Dice rolls from the global `random` in its step: each episode keeps its own state."""
    team = arena(tmp_path, "PigDice-v0-short", 'moves: ["[roll]", "[hold]"]')
    random.seed(7)
    mine = random.getstate()
    runs = [play(team, {"p0": roll, "p1": roll}, tmp_path, episodes=6, seed=3, concurrency=c) for c in (1, 6)]
    assert random.getstate() == mine  # the caller's `random` is untouched
    one, six = ([[t.content for t in ep.turns] + [ep.outcome["detail"]] for ep in run.episodes] for run in runs)
    assert one == six and len({len(turns) for turns in one}) > 1  # and the games differ from each other


def test_a_seed_deals_the_same_letters_from_numpy(tmp_path, monkeypatch):
    """SpellingBee deals its letters from numpy's global random, which TextArena's seed does not reach:
    one seed dealt other letters in each run."""
    spelling_bee = pytest.importorskip("textarena.envs.SpellingBee.env")
    monkeypatch.setattr(spelling_bee, "EnglishDictionary", lambda **kwargs: None)  # nltk's words: a download
    team = arena(tmp_path, "SpellingBee-v0")

    def letters(concurrency: int) -> dict[str, str]:
        dealt = {}

        def player(request):
            dealt[request.episode] = re.search(r"Allowed Letters: (\w+)", request.context["observation"])[1]
            return json.dumps({"move": "[]"})  # no word: the second loses the game

        np.random.seed(concurrency)  # the caller's numpy state differs from run to run
        mine = np.random.get_state()[1].copy()
        play(team, {"p0": player, "p1": player}, tmp_path, episodes=4, seed=3, concurrency=concurrency)
        assert (np.random.get_state()[1] == mine).all()  # and is left as it was
        return dealt

    one, four = letters(1), letters(4)
    assert one == four and len(set(one.values())) > 1  # the same deals, each episode its own


@pytest.mark.parametrize("env_id,endings", [
    ("Chopsticks-v0", ("Both opponent hands dead.", "The turn limit has been reached.")),
    ("Breakthrough-v0-tiny", ("White reached Black's home row.", "Black reached White's home row.",
                              "All White pieces captured.", "All Black pieces captured.")),
])
def test_random_players_finish_by_the_rules(tmp_path, env_id, endings):
    result = play(arena(tmp_path, env_id), RANDOM, tmp_path, episodes=4)
    assert len(result.episodes) == 4
    for ep in result.episodes:
        assert ep.status == "ok" and alternating(ep) and ep.outcome["invalid_move"] == []
        assert ep.outcome["detail"] in endings
        draw = ep.outcome["detail"] == "The turn limit has been reached."
        assert sorted(ep.outcome["results"].values()) == (["draw", "draw"] if draw else ["loss", "win"])


def accepts(env, move: str) -> bool:
    """Whether TextArena takes ``move`` now: the game ends or passes to the other player (an invalid
    move keeps the player, who is asked to retry)."""
    trial = copy.deepcopy(env)
    player = trial.state.current_player_id
    done, _ = trial.step(move)
    return done or trial.state.current_player_id != player


SQUARES = [f"{col}{row}" for col in "abcde" for row in range(1, 6)]


@pytest.mark.parametrize("env_id,candidates", [
    ("Nim-v0", [f"[{pile} {n}]" for pile in range(4) for n in range(7)]),
    ("Chopsticks-v0", [f"[attack {m} {o}]" for m in (0, 1) for o in (0, 1)]
     + [f"[split {a} {b}]" for a in range(9) for b in range(9)]),
    ("Breakthrough-v0-tiny", [f"[{a}{b}]" for a in SQUARES for b in SQUARES]),
])
def test_state_moves_are_the_moves_textarena_accepts(env_id, candidates):
    pytest.importorskip("textarena")
    env, moves_of, rng = start(env_id, {}, 2, seed=0), state_moves(env_id), random.Random(0)
    for ply in range(10):
        legal = moves_of(env, env.state.current_player_id)
        assert len(set(legal)) == len(legal) and set(legal) == {m for m in candidates if accepts(env, m)}
        if env.step(rng.choice(legal))[0]:
            break
    assert ply >= 2  # positions after play were checked too, not only the opening


def test_textarena_judges_its_own_invalid_moves(tmp_path):
    team = arena(tmp_path, "TicTacToe-v0")
    (ep,) = play(team, {"p0": moves("[4]", "[4]", "[4]", "[4]"), "p1": moves("[4]", "[4]", "[4]")}, tmp_path).episodes
    assert ep.status == "ok" and ep.outcome["reason"] == "game_over"
    assert ep.outcome["results"]["p1"] == "loss" and ep.outcome["invalid_move"] == ["p1"]


def eval_json(cli, tmp_path, team) -> tuple[dict, str]:
    code, out, err = cli("eval", team.path, "--episodes", "3", "--json", "--policy", "p0=builtin:random",
                         "--opponent", "random", "--out", tmp_path / "ev")
    assert code == 0, err
    return json.loads(out), err


def test_eval_says_random_is_no_baseline_where_the_game_lists_no_moves(cli, tmp_path):
    report, err = eval_json(cli, tmp_path, arena(tmp_path, "IteratedRockPaperScissors-v0"))  # no `moves` given
    assert report["illegal_baseline"] == ["p0", "p1"]
    assert len([line for line in err.splitlines() if "builtin:random is no baseline here" in line]) == 1
    assert report["roles"]["p0"]["loss"] == 3  # the first to move sends a word twice and forfeits


def test_eval_of_a_game_with_known_moves_flags_nothing(cli, tmp_path):
    report, err = eval_json(cli, tmp_path, arena(tmp_path, "Nim-v0"))
    assert report["illegal_baseline"] == [] and "no baseline" not in err
    assert report["roles"]["p0"]["games"] == 3


def test_a_player_whose_schema_has_no_move_is_refused_at_load(tmp_path):
    """An own role whose move is ``{"square": "[4]"}`` loaded, then sent TextArena no move and lost every game."""
    pytest.importorskip("textarena")
    with pytest.raises(ConfigError, match=r"team.yaml:2: protocol: TextArenaEnv reads field\(s\) move of the messages of role 'p0'"):
        load_team(no_move_field(tmp_path, "{type: textarena, env_id: TicTacToe-v0, players: [p0, p1]}"))
