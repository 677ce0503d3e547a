"""structlog set-up: readable console lines for people, JSON lines with ``--log-json``."""
from __future__ import annotations

import logging
import sys

import structlog

_json_logs = False  # --log-json: stderr holds JSON lines only
_library_lines: logging.Handler | None = None  # ours on the root logger, replaced as configure is called again


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time (tests and progress bars swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(json_logs: bool = False, level: str = "info", libraries: bool = False) -> None:
    """structlog's lines on stderr; with ``libraries`` (the CLI's process, not a script that imports
    rolecast and keeps its own logging), libraries' log records and Python's warnings too."""
    global _json_logs
    _json_logs = json_logs
    renderer = structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    stamped = [structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso" if json_logs else "%H:%M:%S")]
    structlog.configure(
        processors=[*stamped, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    if libraries:
        render_library_lines(stamped, renderer)


def render_library_lines(stamped: list, renderer: structlog.typing.Processor) -> None:
    """Libraries' log records (transformers', torch's; ``models.py`` hands transformers' to the root
    logger) and Python's warnings as lines of ours: their plain text was console lines among
    --log-json's JSON ones."""
    global _library_lines
    root = logging.getLogger()
    root.removeHandler(_library_lines)
    _library_lines = logging.StreamHandler(_CurrentStderr())
    _library_lines.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[*stamped, structlog.stdlib.add_logger_name]))
    root.addHandler(_library_lines)
    logging.captureWarnings(True)


def say(text: str, level: str = "info") -> None:
    """A command's line to its user on stderr (where its results went, a mistake): the text itself,
    or with --log-json a log line whose event it is."""
    if _json_logs:
        getattr(structlog.get_logger(), level)(text)
    else:
        print(text, file=sys.stderr)
