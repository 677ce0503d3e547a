"""``prisoners_dilemma``: the iterated Prisoner's Dilemma, a mixed-motive game.

    protocol:
      type: prisoners_dilemma
      players: [alice, bob]
      rounds: 5
      payoffs: {temptation: 5, reward: 3, punishment: 1, sucker: 0}
      illegal_penalty: -1.0

Each round both players ``cooperate`` or ``defect``: both cooperate, each gets ``reward``; both
defect, each gets ``punishment``; a defector facing a cooperator gets ``temptation`` and the
cooperator ``sucker``. The result (win/draw/loss) compares the totals.
"""
from __future__ import annotations

from pydantic import Field

from .base import Options
from .matrix_game import MatrixGameConfig, MatrixGameEnv


class Payoffs(Options):
    temptation: float = 5.0
    reward: float = 3.0
    punishment: float = 1.0
    sucker: float = 0.0


class PrisonersDilemmaConfig(MatrixGameConfig):
    payoffs: Payoffs = Field(default_factory=Payoffs)


class PrisonersDilemmaEnv(MatrixGameEnv):
    Config = PrisonersDilemmaConfig
    actions = ("cooperate", "defect")
    title = "Iterated Prisoner's Dilemma"
    config: PrisonersDilemmaConfig

    def payoff(self, first: str, second: str) -> tuple[float, float]:
        p = self.config.payoffs
        table = {
            ("cooperate", "cooperate"): (p.reward, p.reward),
            ("cooperate", "defect"): (p.sucker, p.temptation),
            ("defect", "cooperate"): (p.temptation, p.sucker),
            ("defect", "defect"): (p.punishment, p.punishment),
        }
        return table[first, second]

    def rules(self) -> str:
        p = self.config.payoffs
        return (f"Both cooperate: you each get {p.reward:g}. Both defect: you each get {p.punishment:g}. "
                f"If you defect while the other cooperates you get {p.temptation:g} and they get {p.sucker:g}.")
