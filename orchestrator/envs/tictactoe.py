"""``tictactoe``: two roles (often one adapter: self-play) take turns on a 3x3 board.

    protocol:
      type: tictactoe
      players: [x, o]            # x moves first
      rewards: {win: 1.0, loss: -1.0, draw: 0.0}
      illegal_penalty: -1.0      # an occupied or unknown square: the game ends, the mover loses

Squares are named by column and row, ``a1`` (top left) to ``c3`` (bottom right); a move is
``{"move": "b2"}``. Each player observes the board from its own side (its mark, its legal moves).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import Field

from ..messages import Message
from .base import StepResult
from .game import GameEnv, TwoPlayerConfig, WinLossRewards, move_of

CELLS = [f"{col}{row}" for row in "123" for col in "abc"]
LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
MARKS = ("X", "O")
EMPTY = "."


class TicTacToeConfig(TwoPlayerConfig):
    players: list[str] = Field(["x", "o"], min_length=2, max_length=2)
    rewards: WinLossRewards = Field(default_factory=WinLossRewards)

    def turns_needed(self) -> int:
        return len(CELLS)  # a drawn game fills the board


@lru_cache(maxsize=None)
def winner(board: tuple[str, ...]) -> str | None:
    """The mark with three in a row, if any."""
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


def render(board: list[str] | tuple[str, ...]) -> str:
    rows = ["   a b c"] + [f"{r + 1}  " + " ".join(board[3 * r:3 * r + 3]) for r in range(3)]
    return "\n".join(rows)


class TicTacToeEnv(GameEnv):
    Config = TicTacToeConfig
    observation_keys = frozenset({"observation", "legal_moves", "board", "mark", "moves"})
    move_field = "move"
    config: TicTacToeConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.board = [EMPTY] * 9
        self.moves: list[dict[str, str]] = []

    def _mark(self, role: str) -> str:
        return MARKS[self.config.players.index(role)]

    def legal_moves(self) -> list[str]:
        return [cell for cell, v in zip(CELLS, self.board) if v == EMPTY]

    def next_role(self) -> str | None:
        return None if self.done else self.config.players[len(self.moves) % 2]

    def observe(self, role: str) -> dict[str, Any]:
        mark = self._mark(role)
        text = (f"Tic-Tac-Toe. You play {mark}; three in a row (across, down or diagonal) wins.\n"
                f"{render(self.board)}\nYour move, {mark}.")
        return {"observation": text, "legal_moves": self.legal_moves(), "board": list(self.board),
                "mark": mark, "moves": list(self.moves)}

    async def step(self, role: str, message: Message) -> StepResult:
        if not message.valid:
            return self.forfeit(role, "invalid")
        move = move_of(message)
        if move not in self.legal_moves():
            return self.forfeit(role, "illegal")
        mark = self._mark(role)
        self.board[CELLS.index(move)] = mark
        self.moves.append({"role": role, "mark": mark, "move": move})
        r = self.config.rewards
        if winner(tuple(self.board)) == mark:
            results = {p: ("win" if p == role else "loss") for p in self.config.players}
            return self.finish(results, {p: (r.win if p == role else r.loss) for p in self.config.players}, "line")
        if EMPTY not in self.board:
            return self.finish({p: "draw" for p in self.config.players}, {p: r.draw for p in self.config.players}, "full")
        return StepResult()
