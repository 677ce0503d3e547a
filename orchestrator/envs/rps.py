"""``rps``: Rock-Paper-Scissors over several rounds.

    protocol:
      type: rps
      players: [alice, bob]
      rounds: 3
      rewards: {win: 1.0, loss: -1.0, draw: 0.0}   # per round
      illegal_penalty: -1.0

Rock beats scissors, scissors beat paper, paper beats rock. Every round pays its result; the
result of the game compares the totals. Self-play without an opponent pool chases its own last
strategy round and round here (the ``self-play`` trainer's snapshots anchor it).
"""
from __future__ import annotations

from pydantic import Field

from .game import WinLossRewards
from .matrix_game import MatrixGameConfig, MatrixGameEnv

BEATS = {"rock": "scissors", "scissors": "paper", "paper": "rock"}


class RPSConfig(MatrixGameConfig):
    rounds: int = Field(3, ge=1, le=100)
    rewards: WinLossRewards = Field(default_factory=WinLossRewards)


class RPSEnv(MatrixGameEnv):
    Config = RPSConfig
    actions = ("rock", "paper", "scissors")
    title = "Rock-Paper-Scissors"
    config: RPSConfig

    def payoff(self, first: str, second: str) -> tuple[float, float]:
        r = self.config.rewards
        if first == second:
            return r.draw, r.draw
        return (r.win, r.loss) if BEATS[first] == second else (r.loss, r.win)

    def rules(self) -> str:
        r = self.config.rewards
        return (f"Rock beats scissors, scissors beat paper, paper beats rock. A round won pays {r.win:g}, "
                f"lost {r.loss:g}, drawn {r.draw:g}.")
