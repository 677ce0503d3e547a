"""Errors a user can act on: each renders as one line ``FILE:LINE: KEY: problem``."""
from __future__ import annotations

from pathlib import Path

EXIT_USAGE = 2  # the exit code of a command stopped by a user's mistake (argparse's own)


def one_line(exc: BaseException) -> str:
    """``TYPE: TEXT``, TEXT's lines joined (pydantic's ValidationError, say, spans several)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


class RolecastError(Exception):
    """Base class of every error rolecast reports to a user without a traceback."""

    exit_code = EXIT_USAGE


class RunFailed(RolecastError):
    """Work that started could not go on (every episode of a training step failed): exit 1, as
    ``rolecast run`` when all its episodes fail, not the usage code."""

    exit_code = 1


class WorkersLost(RunFailed):
    """The rollout workers' Ray node died: no episode can play there, so the run stops (a fault of
    no episode's own, unlike the errors run_team records as an episode's result)."""


class ConfigError(RolecastError):
    def __init__(self, file: str | Path | None, line: int | None, key: str, problem: str):
        self.file = str(file) if file is not None else "<config>"
        self.line = line
        self.key = key or "(root)"
        self.problem = " ".join(str(problem).split())  # one line, always
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.problem}"


class PolicyError(RolecastError):
    """A policy could not produce text at all (not a bad message: those are retried)."""
