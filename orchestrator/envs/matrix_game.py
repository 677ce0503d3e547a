"""Repeated two-player matrix games: each round both players pick an action without seeing the
other's pick for that round; payoffs are paid every round, and the totals decide the result.

The first player acts first in each round, but the second player's observation holds only the
rounds already played, so the moves are in effect simultaneous.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from pydantic import Field

from ..messages import Message
from .base import StepResult
from .game import GameEnv, TwoPlayerConfig, move_of, results_by_score


class MatrixGameConfig(TwoPlayerConfig):
    players: list[str] = Field(["alice", "bob"], min_length=2, max_length=2)
    rounds: int = Field(5, ge=1, le=100)

    def turns_needed(self) -> int:
        return 2 * self.rounds  # a move each a round


class MatrixGameEnv(GameEnv):
    actions: ClassVar[tuple[str, ...]]
    title: ClassVar[str]
    observation_keys = frozenset({"observation", "legal_moves", "history", "round", "rounds", "score"})
    move_field = "move"
    config: MatrixGameConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.pending: str | None = None  # the first player's action in the current round
        self.history: list[tuple[str, str]] = []
        self.totals = {p: 0.0 for p in self.config.players}

    @abstractmethod
    def payoff(self, first: str, second: str) -> tuple[float, float]:
        """Rewards of (first player, second player) for one round."""

    @abstractmethod
    def rules(self) -> str:
        """One paragraph a player reads before the history."""

    def next_role(self) -> str | None:
        return None if self.done else self.config.players[self.pending is not None]

    def _history(self, role: str) -> list[dict[str, Any]]:
        me = self.config.players.index(role)
        return [{"round": i + 1, "you": pair[me], "opponent": pair[1 - me], "payoff": self.payoff(*pair)[me]}
                for i, pair in enumerate(self.history)]

    def observe(self, role: str) -> dict[str, Any]:
        history = self._history(role)
        lines = [f"{self.title}, round {len(self.history) + 1} of {self.config.rounds}. {self.rules()}"]
        lines += [f"Round {h['round']}: you played {h['you']}, your opponent played {h['opponent']}; "
                  f"you got {h['payoff']:g}." for h in history]
        lines.append(f"Your total so far: {self.totals[role]:g}. Choose your action for this round.")
        return {"observation": "\n".join(lines), "legal_moves": list(self.actions), "history": history,
                "round": len(self.history) + 1, "rounds": self.config.rounds, "score": self.totals[role]}

    async def step(self, role: str, message: Message) -> StepResult:
        if not message.valid:
            return self.forfeit(role, "invalid")
        action = move_of(message)
        if action not in self.actions:
            return self.forfeit(role, "illegal")
        if self.pending is None:
            self.pending = action
            return StepResult()
        first, second = self.config.players
        pair = (self.pending, action)
        self.pending = None
        self.history.append(pair)
        paid = dict(zip((first, second), self.payoff(*pair)))
        for p, value in paid.items():
            self.totals[p] += value
        if len(self.history) == self.config.rounds:
            return self.finish(results_by_score(self.totals), paid, "rounds")
        return StepResult(rewards=paid)

    def outcome(self) -> dict[str, Any]:
        return {**super().outcome(), "totals": self.totals, "history": [list(pair) for pair in self.history]}
