"""structlog set-up: readable console lines for people, JSON lines with ``--log-json``."""
from __future__ import annotations

import logging
import sys

import structlog

_json_logs = False  # --log-json: stderr holds JSON lines only


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time (tests and progress bars swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(json_logs: bool = False, level: str = "info") -> None:
    global _json_logs
    _json_logs = json_logs
    renderer = structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso" if json_logs else "%H:%M:%S"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )


def say(text: str, level: str = "info") -> None:
    """A command's line to its user on stderr (where its results went, a mistake): the text itself,
    or with --log-json a log line whose event it is."""
    if _json_logs:
        getattr(structlog.get_logger(), level)(text)
    else:
        print(text, file=sys.stderr)
