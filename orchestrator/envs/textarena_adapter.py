"""``textarena``: any TextArena game as a rolecast environment (extra ``games``).

    protocol:
      type: textarena
      env_id: TicTacToe-v0
      players: [p0, p1]          # one role per TextArena player, in player-id order
      moves: null                # fixed legal moves to offer, e.g. ["[rock]", "[paper]", "[scissors]"]
      env_kwargs: {}

A role sends ``{"move": "[4]"}``; the text goes to TextArena as the player's action, and
TextArena's own rules judge it (its invalid-move handling and rewards apply). Each role observes
its player's TextArena observation. ``legal_moves`` are the ``moves`` given here, else those read
from the game state for the games in ``STATE_MOVES`` (Nim, Chopsticks, Breakthrough, in every
variant), else the quoted bracketed moves the last "available/valid moves" line of the observation
lists (as TicTacToe-v0 prints them), else empty: then ``builtin:random`` can only send random words,
which TextArena rejects, and ``rolecast eval`` says so. Rewards are TextArena's final rewards; the
results compare them (a one-player game is won only at reward 1, solved); the outcome adds
TextArena's reason (``detail``) and the roles that lost on an invalid move (``invalid_move``).
TextArena's games draw from Python's global ``random`` (a few from numpy's: SpellingBee's letters):
each episode keeps its own state of both, seeded from its seed (``OwnRandom``), so a seed plays the
same game at any concurrency and the caller's are left as they were.
"""
from __future__ import annotations

import random
import re
from contextlib import contextmanager
from typing import Any, Callable, ClassVar, Literal

from pydantic import Field, model_validator

from ..messages import Message
from .base import StepResult
from .game import GameConfig, GameEnv, require, results_by_score

MOVES_LINE = re.compile(r"(?:available|valid|legal) (?:moves|actions)[^\n]*", re.IGNORECASE)
QUOTED_MOVE = re.compile(r"'(\[[^\]'\n]+\])'")


def listed_moves(observation: str) -> list[str]:
    lines = MOVES_LINE.findall(observation)
    return QUOTED_MOVE.findall(lines[-1]) if lines else []


def nim_moves(env: Any, player: int) -> list[str]:
    """Take 1..n objects from a pile of n."""
    piles = env.state.game_state["piles"]
    return [f"[{i} {n}]" for i, pile in enumerate(piles) for n in range(1, pile + 1)]


def chopsticks_moves(env: Any, player: int) -> list[str]:
    """Attack a live hand with a live hand, or split your fingers into any other (L, R) with the same sum."""
    hands = env.state.game_state["hands"]
    mine, theirs = hands[player], hands[1 - player]
    attacks = [f"[attack {m} {o}]" for m in (0, 1) for o in (0, 1) if mine[m] and theirs[o]]
    total = sum(mine)
    return attacks + [f"[split {left} {total - left}]" for left in range(total + 1) if [left, total - left] != list(mine)]


def breakthrough_moves(env: Any, player: int) -> list[str]:
    """One row forward (White up, Black down): straight onto an empty square, diagonally onto an enemy piece."""
    board, size = env.state.game_state["board"], env.board_size
    mine, theirs, step = ("W", "B", 1) if player == 0 else ("B", "W", -1)

    def square(row: int, col: int) -> str:
        return f"{chr(ord('a') + col)}{row + 1}"

    return [f"[{square(r, c)}{square(r + step, c + dc)}]"
            for r, row in enumerate(board) for c, piece in enumerate(row) if piece == mine and 0 <= r + step < size
            for dc in (-1, 0, 1) if 0 <= c + dc < size and board[r + step][c + dc] == (theirs if dc else "")]


# Games whose observation lists no moves but whose state makes them easy to enumerate, by entry point
# (which every registered variant of a game shares: Nim-v0, Nim-v0-large, Nim-v0-train, ...).
STATE_MOVES: dict[str, Callable[[Any, int], list[str]]] = {
    "textarena.envs.Nim.env:NimEnv": nim_moves,
    "textarena.envs.Chopsticks.env:ChopsticksEnv": chopsticks_moves,
    "textarena.envs.Breakthrough.env:BreakthroughEnv": breakthrough_moves,
}


def state_moves(env_id: str) -> Callable[[Any, int], list[str]] | None:
    from textarena.envs.registration import ENV_REGISTRY

    return STATE_MOVES.get(str(ENV_REGISTRY[env_id].entry_point))


class OwnRandom:
    """States of Python's and numpy's global random, lent to them around the calls into one game:
    episodes interleave at every await, and would otherwise draw each other's dice."""

    def __init__(self) -> None:
        self.state: tuple[object, object] | None = None  # the first call, the reset, seeds them

    @staticmethod
    def _swap(state: tuple[object, object] | None) -> tuple[object, object]:
        """Set ``state`` (None: leave them) and return the one it replaced."""
        import numpy as np  # here, not at the top: every command imports this module, few play TextArena

        old = random.getstate(), np.random.get_state()
        if state is not None:
            random.setstate(state[0])
            np.random.set_state(state[1])
        return old

    @contextmanager
    def lent(self):
        outer = self._swap(self.state)
        try:
            yield
        finally:
            self.state = self._swap(outer)


def start(env_id: str, env_kwargs: dict[str, Any], players: int, seed: int, own: OwnRandom | None = None) -> Any:
    import numpy as np
    import textarena

    with (own or OwnRandom()).lent():
        np.random.seed(seed)  # TextArena's reset seeds `random` only: SpellingBee deals its letters from numpy's
        env = textarena.make(env_id=env_id, **env_kwargs)
        env.reset(num_players=players, seed=seed)  # TextArena seeds the global `random` from this seed
    return env


class TextArenaConfig(GameConfig):
    env_id: str
    moves: list[str] | None = None
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    on_invalid: Literal["end"] = "end"
    no_illegal_penalty: ClassVar[str] = "TextArena judges invalid moves and pays them its own rewards"

    @model_validator(mode="after")
    def _known_env(self) -> "TextArenaConfig":
        require("textarena")
        from textarena.envs.registration import ENV_REGISTRY

        if self.env_id not in ENV_REGISTRY:
            raise ValueError(f"unknown TextArena env_id {self.env_id!r}")
        try:  # now, not as every episode's error: a reset checks the player count too
            env = start(self.env_id, self.env_kwargs, len(self.players), seed=0)
        except TypeError as exc:  # an env_kwargs key the game does not take
            raise ValueError(f"{self.env_id}: {exc}") from None
        except Exception as exc:  # a player count the game refuses, or a game that cannot start here
            line = next((line.strip() for line in str(exc).splitlines() if any(c.isalnum() for c in line)), "")
            raise ValueError(f"{self.env_id} with {len(self.players)} players failed to start: "
                             f"{type(exc).__name__}: {line}".rstrip(": ")) from None
        observation = env.get_observation()[1]
        env.close()
        if not isinstance(observation, str):  # a -raw variant's message tuples: every episode failed on them
            base = self.env_id.removesuffix("-raw")
            raise ValueError(f"{self.env_id} observes a {type(observation).__name__}, not text (no TextArena "
                             f"observation wrapper)" + (f": use {base}" if base != self.env_id else ""))
        return self

    def legal_moves_known(self) -> bool:
        """Whether the views list the legal moves, so ``builtin:random`` plays legally: ``moves`` are
        given, the game is in ``STATE_MOVES``, or its first observation lists them (a trial reset)."""
        if self.moves or state_moves(self.env_id):
            return True
        env = start(self.env_id, self.env_kwargs, len(self.players), seed=0)
        try:
            return bool(listed_moves(env.get_observation()[1]))
        finally:
            env.close()


class TextArenaEnv(GameEnv):
    Config = TextArenaConfig
    observation_keys = frozenset({"observation", "legal_moves", "player_id"})
    move_field = "move"
    config: TextArenaConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        c = self.config
        self.random = OwnRandom()
        self.env = start(c.env_id, c.env_kwargs, len(c.players), self.rng.randrange(2**31), self.random)
        self.enumerate_moves = state_moves(c.env_id)
        self.player_id, self.text = self.env.get_observation()
        self.detail: str | None = None
        self.invalid_move: list[str] = []

    def legal_moves(self) -> list[str]:
        if self.config.moves:
            return self.config.moves
        if self.enumerate_moves is not None:
            return self.enumerate_moves(self.env, self.player_id)
        return listed_moves(self.text)

    def next_role(self) -> str | None:
        return None if self.done else self.config.players[self.player_id]

    def observe(self, role: str) -> dict[str, Any]:
        return {"observation": self.text.strip(), "legal_moves": self.legal_moves(), "player_id": self.player_id}

    async def step(self, role: str, message: Message) -> StepResult:
        if not message.valid:
            return self.forfeit(role, "invalid")
        with self.random.lent():
            done, _ = self.env.step(action=str(message.content.get("move", "")))
            if not done:
                self.player_id, self.text = self.env.get_observation()
                return StepResult()
            rewards, info = self.env.close()  # where TextArena hands out the final rewards
        players = self.config.players
        scores = {p: float((rewards or {}).get(i, 0.0)) for i, p in enumerate(players)}
        views = [info.get(i) or {} for i in range(len(players))] if isinstance(info, dict) else []
        self.detail = next((str(v["reason"]) for v in views if v.get("reason")), None)
        self.invalid_move = [p for p, v in zip(players, views) if v.get("invalid_move")]
        # A one-player game pays 1 when solved and the share done when not (0.5: a near miss), no win
        solo = {p: ("win" if s >= 1 else "loss") for p, s in scores.items()}
        results = results_by_score(scores) if len(players) > 1 else solo
        return self.finish(results, scores, "game_over")

    def outcome(self) -> dict[str, Any]:
        return {**super().outcome(), "detail": self.detail, "invalid_move": self.invalid_move}

    async def close(self) -> None:
        self.env.close()
