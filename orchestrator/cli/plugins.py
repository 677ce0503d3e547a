"""``rolecast plugins``: what is installed, what each plugin registers, and what failed to load."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ..registry import SINGULAR, default_registry
from .flags import print_table, stdout_console


def register(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list installed plugins and what they register")
    p.add_argument("--json", action="store_true", help="print the registrations and failures as JSON")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    registry = default_registry()
    rows = [
        {"plugin": reg.plugin, "kind": SINGULAR[kind], "name": name, "source": reg.source}
        for kind, items in registry.items.items()
        for name, reg in sorted(items.items())
    ] + [{"plugin": reg.plugin, "kind": "command", "name": reg.name, "source": reg.source} for reg in registry.command_names]
    failures = [{"plugin": f.plugin, "source": f.source, "error": f.error} for f in registry.failures]
    if args.json:
        print(json.dumps({"registered": rows, "failed": failures}))
        return 0
    console = stdout_console()
    table = Table(title="rolecast plugins")
    for col in ("plugin", "kind", "name", "source"):
        # a source folds where the table is too wide; a name, cut ("generat…"), could be another's
        folds = col == "source"
        table.add_column(col, no_wrap=not folds, overflow="fold", min_width=len(col) if folds else None)
    # escaped: rich reads "[...]" in a cell or an error as markup, dropping it ("pkg[extra]") or raising ("[/path]")
    for row in rows:
        table.add_row(*(escape(row[col]) for col in ("plugin", "kind", "name", "source")))
    print_table(console, table)
    for f in failures:
        console.print(f"[red]failed[/red] plugin {escape(f['plugin'])} ({escape(f['source'])}): {escape(f['error'])}",
                      markup=True, highlight=False)
    return 0
