"""Multi-agent text environments: the one abstraction behind games, counterparts and team protocols."""
from .base import Env, EnvConfig, StepResult

__all__ = ["Env", "EnvConfig", "StepResult"]
