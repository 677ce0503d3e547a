"""``rolecast sandbox run [...] -- CMD...``: run one command in a sandbox from the shell."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sandboxes import BACKENDS, Limits, SandboxError, run

from .. import logs
from ..errors import EXIT_USAGE
from .flags import positive_float, positive_int


def register(sub: Any) -> None:
    sandbox = sub.add_parser("sandbox", help="run commands in a sandbox")
    commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    p = commands.add_parser("run", help="run one command confined to a work directory")
    defaults = Limits()
    p.add_argument("--timeout", type=positive_float, default=defaults.wall_time_s,
                   help=f"wall-time limit, seconds (default {defaults.wall_time_s:g})")
    p.add_argument("--memory", type=positive_int, default=defaults.memory_mb,
                   help=f"memory limit, MiB (default {defaults.memory_mb})")
    # ".", not os.getcwd(): every command builds this parser, and a removed cwd made each a traceback
    p.add_argument("--workdir", default=".", help="writable work directory (default: cwd)")
    p.add_argument("--backend", default="auto", choices=["auto", *BACKENDS],
                   help="isolation: bwrap, unshare, or none with --unsafe (default auto: the best available)")
    p.add_argument("--readable", action="append", default=[], metavar="PATH",
                   help="a host path the command may read (repeatable): it sees only the system folders, "
                        "the running Python and the work directory")
    p.add_argument("--hide", action="append", default=[], metavar="DIR",
                   help="a folder among those it sees that it may not (repeatable)")
    p.add_argument("--unsafe", action="store_true", help="allow backend 'none' (no isolation)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    p.set_defaults(func=handle_run)


def handle_run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        logs.say("rolecast sandbox run: missing command after --", "error")
        return EXIT_USAGE
    try:
        limits = Limits(wall_time_s=args.timeout, memory_mb=args.memory)
        result = run(cmd, args.workdir, limits, backend=args.backend, allow_unsafe=args.unsafe,
                     readable=args.readable, hide=args.hide)
    except (SandboxError, ValueError) as exc:
        logs.say(f"rolecast sandbox run: {exc}", "error")
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        flags = [f for f in ("timed_out", "out_of_memory", "truncated") if getattr(result, f)]
        logs.say(f"[sandbox {result.backend}] exit={result.exit_code} signal={result.signal} "
                 f"{result.duration_s:.2f}s {' '.join(flags)}".rstrip())  # a JSON line with --log-json
    return result.exit_code if result.exit_code is not None else 1
