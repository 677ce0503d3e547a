"""``import rolecast``: the Python API (``orchestrator/api.py``), what the ``rolecast`` commands do.

    import rolecast

    result = rolecast.run("recipes/debate.yaml", episodes=8)
    trained = rolecast.train("recipes/guess_number.yaml", steps=2)
"""
from orchestrator.api import Evaluation, TrainResult, evaluate, load_team, register_plugin, run, train
from orchestrator.errors import ConfigError, RolecastError
from orchestrator.hookspecs import hookimpl
from orchestrator.rollout import RunResult
from orchestrator.team import Team

__all__ = ["ConfigError", "Evaluation", "RolecastError", "RunResult", "Team", "TrainResult", "evaluate", "hookimpl",
           "load_team", "register_plugin", "run", "train"]
