"""The ``rolecast`` command line: one module per command, flags they share in ``flags.py``.

A user's mistake (bad YAML, unknown role, bad binding) is one line on stderr (a JSON line with
``--log-json``) and exit code 2; ``--debug`` shows the traceback instead. A disk that refuses a
write (full, read-only) is one line naming the file, and exit code 1; so is a path whose name the
system refuses (a folder or file name past 255 bytes), with exit code 2. Ctrl-C stops a command
with exit code 130, SIGTERM with 143, each after the clean-up that ``finally`` blocks do;
``serve`` alone exits 0, as a server told to stop has done its job. Plugins add commands through
the ``register_commands`` hook (``hookspecs.py``).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import importlib
import io
import os
import signal
import sys
import threading
from collections.abc import Iterator

from .. import logs
from ..errors import EXIT_USAGE, ConfigError, RolecastError
from ..files import DISK_FAULTS
from ..registry import default_registry

COMMANDS = ("validate", "run", "train", "compare", "eval", "report", "serve", "plugins", "tasks", "sandbox")


def main(argv: list[str] | None = None) -> int:
    printable_stdout()
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(json_logs=args.log_json, level="debug" if args.debug else "info", libraries=True)
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_USAGE
    try:
        with stopped_by_sigterm():
            return int(args.func(args) or 0)
    except RolecastError as exc:
        if args.debug:
            raise
        logs.say(str(exc) if isinstance(exc, ConfigError) else f"rolecast: {exc}", "error")
        return exc.exit_code
    except Terminated:
        logs.say("rolecast: terminated", "error")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        logs.say("rolecast: interrupted", "error")
        return 130
    except BrokenPipeError:  # `rolecast report RUN | head -1`: the reader has what it wanted
        # Python's own flush at exit would fail on the closed pipe again, with a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:
        if args.debug or exc.errno not in (*DISK_FAULTS, errno.ENAMETOOLONG):
            raise
        # a full or read-only disk is no bug of ours, nor a name too long (--out, a recipe's prompt
        # path: a traceback from wherever it was first used): which file, and why, as our other errors
        logs.say(f"rolecast: {f'{exc.filename}: ' if exc.filename else ''}{exc.strerror}", "error")
        return EXIT_USAGE if exc.errno == errno.ENAMETOOLONG else 1


def printable_stdout() -> None:
    """What stdout's encoding cannot hold (a file name in é, the summary's ±, under
    PYTHONIOENCODING=ascii, LC_ALL=C or a Latin-1 locale) is printed as a \\x escape, as Python
    does on stderr, not a UnicodeEncodeError traceback once the work is done (the C locale's
    surrogateescape fails on them as strict does)."""
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors in ("strict", "surrogateescape"):
        sys.stdout.reconfigure(errors="backslashreplace")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``docker stop``, systemd, a cluster's scheduler), stopping a command
    as Ctrl-C does: Python's default for it ends the process at once, and the clean-up that
    ``finally`` blocks do (a sandbox's workdir handed back to its owner, Ray's workers stopped)
    would never run."""


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM does what Ctrl-C does while the block runs, where no one else handles it, and the
    block ends in Terminated: in ``asyncio.run``, whose SIGINT handler cancels the main task and
    lets its clean-up (a sandbox's run awaited to its end) finish before a second signal raises.
    Raised in the loop at once, a second SIGTERM broke that clean-up off, the loop closed under it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    received = []

    def terminate(signum: int, frame: object) -> None:
        received.append(signum)
        ctrl_c = signal.getsignal(signal.SIGINT)
        if callable(ctrl_c):
            ctrl_c(signal.SIGINT, frame)
        elif len(received) == 1:  # SIGINT ignored (a job started in the background): SIGTERM still
            stop_here_or_in_loop()  # stops it, and a second leaves alone the clean-up the first began

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except KeyboardInterrupt:
        if received:
            raise Terminated from None
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_here_or_in_loop() -> None:
    """Raise Terminated here, or where an event loop runs in this thread, from it between two of
    its steps: raised in a step, in a coroutine's own code, it skipped the clean-up that
    coroutine's ``except`` or ``finally`` would do once cancelled."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise Terminated from None
    loop.call_soon_threadsafe(raise_terminated)


def raise_terminated() -> None:
    raise Terminated


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rolecast", description="Teams of LLM roles that learn together.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--log-json", action="store_true",
                        help="stderr as JSON lines (logs, notes and errors) instead of console text, with no progress bar")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    default_registry().add_commands(sub)
    return parser
