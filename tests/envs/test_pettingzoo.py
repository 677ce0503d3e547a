"""The PettingZoo adapter, on classic turn-based games with random players (extra `games`)."""
from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict

import pytest

from play import Script, moves, play
from support import write
from orchestrator.envs.pettingzoo_adapter import registry_id
from orchestrator.errors import ConfigError
from orchestrator.team import load_team


def zoo(tmp_path, env: str, players: tuple[str, str] = ("p1", "p2"), env_kwargs: str = "{}",
        max_turns: int = 64) -> object:
    pytest.importorskip("pettingzoo")
    path = write(tmp_path / "team.yaml", f"""
        name: zoo
        max_turns: {max_turns}
        protocol:
          type: pettingzoo
          env: {env}
          env_kwargs: {env_kwargs}
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


def test_an_invalid_message_forfeits_without_the_illegal_penalty(tmp_path):
    """No JSON (twice, with the retry): the role's invalid_penalty only, not the env's illegal_penalty too."""
    (ep,) = play(zoo(tmp_path, "tictactoe_v3"), {"p1": Script("no move", "none"), "p2": moves()}, tmp_path).episodes
    assert ep.outcome["reason"] == "invalid" and ep.outcome["results"] == {"p1": "loss", "p2": "win"}
    assert ep.rewards == {"p1": -1.0, "p2": 0.0}


def test_a_game_that_truncates_ends_there(tmp_path):
    """rps_v2 ends by truncation after max_cycles rounds: its agents are done all the same."""
    p1, p2 = moves("0", "1", "2"), moves("1", "1", "0")  # rock, paper, scissors against paper, paper, rock
    (ep,) = play(zoo(tmp_path, "rps_v2", env_kwargs="{max_cycles: 3}"), {"p1": p1, "p2": p2}, tmp_path).episodes
    assert ep.status == "ok" and ep.outcome["reason"] == "game_over" and len(ep.turns) == 6
    assert ep.rewards == ep.outcome["totals"] == {"p1": -2.0, "p2": 2.0}
    assert ep.outcome["results"] == {"p1": "loss", "p2": "win"}
    # the second agent (player_1) sees the first's move of the round before (3: none yet)
    assert [(r.context["observation"], r.context["agent"]) for r in p2.requests] == [
        ("Observation: 3", "player_1"), ("Observation: 0", "player_1"), ("Observation: 1", "player_1")]


def test_a_seed_deals_the_same_cards_and_each_episode_its_own(tmp_path):
    """Each episode resets the game from its own seed: the deals differ, and a run replays exactly."""
    def deals() -> list[str]:
        first: dict[str, str] = {}

        def player(request):
            first.setdefault(request.episode, request.context["observation"])
            return json.dumps({"move": request.context["legal_moves"][0]})

        play(zoo(tmp_path, "texas_holdem_v4"), {"p1": player, "p2": player}, tmp_path, episodes=6)
        return [first[key] for key in sorted(first)]

    once = deals()
    assert deals() == once and len(set(once)) == 6


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


# Both sides castle and take en passant (PettingZoo mirrors black's action ids: every kind of move both ways).
CHESS_OPENING = "e2e4 g8f6 g1f3 g7g6 f1c4 f8g7 e1g1 e8g8 e4e5 d7d5 e5d6 a7a5 h2h3 a5a4 b2b4 a4b3".split()


def test_chess_is_played_in_uci_to_the_end(tmp_path):
    """chess_v6 offered ~7,000 plane numbers and action ids 0..4671; now the board and UCI moves,
    each played as python-chess plays it, from a set opening, then at random to the end."""
    chess = pytest.importorskip("chess")
    boards, promoted = defaultdict(chess.Board), Counter()  # per episode: the game python-chess plays beside the env's

    def player(request):
        board, view = boards[request.episode], request.context["observation"]
        assert f"FEN: {board.fen()}\nYou play {'white' if board.turn else 'black'}." in view
        assert set(request.context["legal_moves"]) == {m.uci() for m in board.legal_moves}
        if len(board.move_stack) < len(CHESS_OPENING):
            move = chess.Move.from_uci(CHESS_OPENING[len(board.move_stack)])
        else:  # promotions first, then captures and pawn moves: random games that end in a few hundred plies
            legal = sorted(board.legal_moves, key=lambda m: m.uci())
            rush = [m for m in legal if board.is_capture(m) or board.piece_type_at(m.from_square) == chess.PAWN]
            move = random.Random(request.seed).choice([m for m in legal if m.promotion] or rush or legal)
        if move.promotion:
            promoted[("white" if board.turn else "black", chess.piece_name(move.promotion))] += 1
        board.push(move)
        return json.dumps({"move": move.uci()})

    result = play(zoo(tmp_path, "chess_v6", max_turns=1000), {"p1": player, "p2": player}, tmp_path, episodes=2)
    for ep in result.episodes:
        board = boards[ep.id]
        assert ep.status == "ok" and ep.outcome["reason"] == "game_over" and len(ep.turns) == len(board.move_stack)
        expected = {"1-0": ("win", "loss"), "0-1": ("loss", "win"), "1/2-1/2": ("draw", "draw")}
        assert tuple(ep.outcome["results"].values()) == expected[board.result(claim_draw=True)]
    assert {side for side, _ in promoted} == {"white", "black"} and {piece for _, piece in promoted} > {"queen"}


def test_chess_refuses_a_move_that_is_not_legal_here(tmp_path):
    pytest.importorskip("chess")
    p1, p2 = moves("e2e4"), moves("e7e4")
    (ep,) = play(zoo(tmp_path, "classic/chess-v6"), {"p1": p1, "p2": p2}, tmp_path).episodes
    assert ep.outcome["reason"] == "illegal" and ep.rewards == {"p1": 0.0, "p2": -1.0}
    assert "e7e5" in p2.requests[0].context["legal_moves"] and "2421" not in p2.requests[0].context["legal_moves"]
    assert p2.requests[0].context["observation"].startswith(
        "Board (uppercase: white, lowercase: black):\n8 r n b q k b n r\n7 p p p p p p p p\n6 . . . . . . . .\n"
        "5 . . . . . . . .\n4 . . . . P . . .\n3 . . . . . . . .\n2 P P P P . P P P\n1 R N B Q K B N R\n"
        "  a b c d e f g h\nFEN: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1\nYou play black.\n"
        "Last move: e2e4.")


def test_go_is_played_at_points_to_the_end(tmp_path):
    """go_v5 offered NxNx17 planes and ids 0..N*N; now the board (X yours) and points or pass."""
    last = {}  # per episode: the previous move, which the next player must see played

    def player(request):
        view = request.context["observation"]
        rows = re.findall(r"^ ?(\d+) ((?:[XO.] ){8}[XO.])$", view, re.M)
        board = {f"{col}{row}": cell for row, cells in rows for col, cell in zip("abcdefghj", cells.split())}
        assert len(board) == 81 and f"  a b c d e f g h j\nYou play {'white' if request.turn % 2 else 'black'}." in view
        if request.turn and last[request.episode] != "pass":
            assert board[last[request.episode]] == "O"  # the opponent's stone, where its move named
        if request.turn:  # a pass shows only here
            assert f"Last move: {last[request.episode]}." in view
        legal = request.context["legal_moves"]
        assert legal[-1] == "pass" and all(board[point] == "." for point in legal[:-1])
        last[request.episode] = random.Random(request.seed).choice(legal)
        return json.dumps({"move": last[request.episode]})

    team = zoo(tmp_path, "go_v5", env_kwargs="{board_size: 9}", max_turns=1000)
    result = play(team, {"p1": player, "p2": player}, tmp_path, episodes=3)
    for ep in result.episodes:
        assert ep.status == "ok" and ep.outcome["reason"] == "game_over" and ep.turns[-1].content == {"move": "pass"}
        assert sorted(ep.outcome["results"].values()) == ["loss", "win"]  # komi 7.5: never a draw


def test_go_points_read_as_drawn(tmp_path):
    """a1 is the bottom left point, j9 (no i) the top right; black is the first agent."""
    p1, p2 = moves("a1", "pass"), moves("j9", "pass")
    (ep,) = play(zoo(tmp_path, "go_v5", env_kwargs="{board_size: 9}"), {"p1": p1, "p2": p2}, tmp_path).episodes
    assert ep.outcome["reason"] == "game_over" and ep.outcome["results"] == {"p1": "loss", "p2": "win"}  # komi
    rows = ["9 . . . . . . . . O", *(f"{r} . . . . . . . . ." for r in range(8, 1, -1)), "1 X . . . . . . . .",
            "  a b c d e f g h j"]
    assert p1.requests[1].context["observation"].startswith("Board (X: yours, O: your opponent's):\n" + "\n".join(rows))
    assert p2.requests[0].context["legal_moves"][:2] == ["a9", "b9"] and "a1" not in p2.requests[0].context["legal_moves"]
    assert p1.requests[0].context["legal_moves"][-3:] == ["h1", "j1", "pass"] and len(p1.requests[0].context["legal_moves"]) == 82


COOPERATIVE = """
    from gymnasium.spaces import Discrete
    from pettingzoo import AECEnv


    def env(**kwargs):
        return Together()


    class Together(AECEnv):
        '''Two turns, one each: a point (1), nothing (0) or a slip (2, a point lost), paid to both.'''
        metadata = {"name": "together_v0"}
        possible_agents = ["a", "b"]

        def reset(self, seed=None, options=None):
            self.agents, self.agent_selection, self.moves = list(self.possible_agents), "a", 0
            self.rewards, self._cumulative_rewards = ({a: 0 for a in self.agents} for _ in range(2))
            self.terminations, self.truncations = ({a: False for a in self.agents} for _ in range(2))
            self.infos = {a: {} for a in self.agents}

        def observe(self, agent):
            return [self.moves]

        def action_space(self, agent):
            return Discrete(3)

        def step(self, action):
            if self.terminations[self.agent_selection]:
                return self._was_dead_step(action)
            self.moves += 1
            self.rewards = {a: [0, 1, -1][action] for a in self.agents}
            self.terminations = {a: self.moves == 2 for a in self.agents}
            self.agent_selection = "b"
            self._accumulate_rewards()
    """


@pytest.fixture(scope="module")
def together(tmp_path_factory):
    """The module path of the cooperative game above (one package for every case: imported once)."""
    pytest.importorskip("pettingzoo")
    root = tmp_path_factory.mktemp("coop")
    write(root / "coop_games" / "__init__.py", "")
    write(root / "coop_games" / "together.py", COOPERATIVE)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        yield "coop_games.together"


@pytest.mark.parametrize("a,b,result", [("1", "0", "win"), ("1", "2", "draw"), ("0", "2", "loss")])
def test_a_cooperative_game_is_won_or_lost_together(tmp_path, together, a, b, result):
    """Every reward paid to both alike (Hanabi's way): a shared score above 0 was read as a draw."""
    (ep,) = play(zoo(tmp_path, together), {"p1": moves(a), "p2": moves(b)}, tmp_path).episodes
    assert ep.outcome["reason"] == "game_over" and ep.outcome["results"] == {"p1": result, "p2": result}
    assert ep.outcome["totals"]["p1"] == ep.outcome["totals"]["p2"] == {"win": 1, "draw": 0, "loss": -1}[result]


def test_a_game_that_paid_unequally_once_is_not_cooperative(tmp_path, together, monkeypatch):
    """One unequal payment makes the totals decide, though the last ones were alike."""
    import coop_games.together as game

    def step(self, action):
        if self.terminations[self.agent_selection]:
            return self._was_dead_step(action)
        self.moves += 1
        self.rewards = {"a": 1, "b": 0} if self.moves == 1 else {"a": 0, "b": 0}
        self.terminations = {a: self.moves == 2 for a in self.agents}
        self.agent_selection = "b"
        self._accumulate_rewards()

    monkeypatch.setattr(game.Together, "step", step)
    (ep,) = play(zoo(tmp_path, together), {"p1": moves("0"), "p2": moves("0")}, tmp_path).episodes
    assert ep.outcome["totals"] == {"p1": 1.0, "p2": 0.0} and ep.outcome["results"] == {"p1": "win", "p2": "loss"}


def test_an_env_whose_done_agent_never_leaves_ends_its_episode_not_a_hang(tmp_path, together, monkeypatch):
    """A game whose step ignores a done agent's None action (no _was_dead_step) kept it in the
    game: the adapter stepped it forever, in code that never awaits, so no timeout could end it."""
    import coop_games.together as game

    monkeypatch.setattr(game.Together, "_was_dead_step", lambda self, action: None)
    (ep,) = play(zoo(tmp_path, together), {"p1": moves("1"), "p2": moves("0")}, tmp_path).episodes
    assert ep.status == "error" and "agent 'b' is done, and its None step left it in the game" in ep.error, ep.error


def test_a_player_whose_schema_has_no_move_is_refused_at_load(tmp_path):
    """It sent its field, the adapter read no move and called it illegal: every game lost on turn 1."""
    pytest.importorskip("pettingzoo")
    path = write(tmp_path / "team.yaml", """
        name: zoo
        protocol: {type: pettingzoo, env: chess_v6, players: [p1, p2]}
        roles:
          - use: game_player
            name: p1
            reply_prefix: ""
            output_schema: {type: object, properties: {action: {type: string}}, required: [action]}
          - {use: game_player, name: p2}
        tasks: [{}]
        """)
    with pytest.raises(ConfigError, match=r"team.yaml:2: protocol: PettingZooEnv reads field\(s\) move of the messages of role "
                                          r"'p1', which its output_schema does not declare \(properties: action\)"):
        load_team(path)
