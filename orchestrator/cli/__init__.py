"""The ``rolecast`` command line: one module per command, flags they share in ``flags.py``.

A user's mistake (bad YAML, unknown role, bad binding) is one line on stderr and exit code 2;
``--debug`` shows the traceback instead. Plugins add commands through the ``register_commands``
hook (``hookspecs.py``).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .. import logs
from ..errors import EXIT_USAGE, ConfigError, RolecastError
from ..registry import default_registry

COMMANDS = ("validate", "run", "train", "compare", "eval", "report", "serve", "plugins", "tasks", "sandbox")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(json_logs=args.log_json, level="debug" if args.debug else "info")
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except RolecastError as exc:
        if args.debug:
            raise
        print(str(exc) if isinstance(exc, ConfigError) else f"rolecast: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rolecast: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rolecast", description="Teams of LLM roles that learn together.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines instead of console text")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    default_registry().add_commands(sub)
    return parser
