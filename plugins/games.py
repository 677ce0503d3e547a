"""The game environments and their reference policies (``builtin:random`` and friends)."""
from __future__ import annotations

from orchestrator.envs.guess_number import GuessNumberEnv
from orchestrator.envs.pettingzoo_adapter import PettingZooEnv
from orchestrator.envs.prisoners_dilemma import PrisonersDilemmaEnv
from orchestrator.envs.rps import RPSEnv
from orchestrator.envs.textarena_adapter import TextArenaEnv
from orchestrator.envs.tictactoe import TicTacToeEnv
from orchestrator.envs.twenty_questions import TwentyQuestionsEnv
from orchestrator.hookspecs import hookimpl
from orchestrator.policies.baselines import BinarySearchPolicy, MinimaxPolicy, RandomPolicy


@hookimpl
def register_envs(register):
    register("guess_number", GuessNumberEnv)
    register("twenty_questions", TwentyQuestionsEnv)
    register("tictactoe", TicTacToeEnv)
    register("prisoners_dilemma", PrisonersDilemmaEnv)
    register("rps", RPSEnv)
    register("textarena", TextArenaEnv)
    register("pettingzoo", PettingZooEnv)


@hookimpl
def register_policies(register):
    register("random", RandomPolicy)
    register("minimax", MinimaxPolicy)
    register("binary-search", BinarySearchPolicy)
