"""``rolecast validate PATH...``: check role and team files; one line per bad file, exit 2."""
from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import logs
from ..errors import EXIT_USAGE, ConfigError, RolecastError


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="check role and team YAML files (or folders of them)")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                   help="role or team YAML files, or folders of them (hidden folders, virtualenvs and run dirs "
                        "in a folder are passed over; a tasks file, a list, is checked with its team)")
    p.set_defaults(func=handle)


def yaml_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(_walk(path))
        else:
            files.append(path)
    return files


def _walk(folder: Path) -> Iterator[Path]:
    """The YAML files under ``folder``, less those that are not the user's roles or teams: a
    package's (hidden folders such as .venv, a virtualenv by its pyvenv.cfg) and a run's record
    (`validate .` in a project had failed on every one)."""
    for root, dirs, names in os.walk(folder):
        here = Path(root)
        if _is_run_dir(here):
            dirs.clear()
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (here / d / "pyvenv.cfg").exists()]
        yield from (here / n for n in names if Path(n).suffix.lower() in (".yaml", ".yml"))


def _is_run_dir(folder: Path) -> bool:
    """Whether ``folder/config.yaml`` is what `run` or `train` recorded: the team (or recipe) and the run's options."""
    from ..yamlfile import load_yaml

    if not (folder / "config.yaml").is_file():
        return False
    try:
        data = load_yaml(folder / "config.yaml").data
    except ConfigError:
        return False
    return isinstance(data, dict) and "run" in data and bool({"team", "recipe"} & set(data))


def handle(args: argparse.Namespace) -> int:
    from ..config import TEAM_KEYS
    from ..role import load_role
    from ..team import load_team
    from ..yamlfile import load_yaml

    failed = 0
    files = yaml_files(args.paths)
    if not files:
        raise RolecastError("no YAML files found in " + ", ".join(map(str, args.paths)))
    for path in files:
        try:
            data = load_yaml(path).data
            if isinstance(data, list):  # no role or team is a list: a team's tasks file, which load_team reads
                print(f"--  {path}  (tasks, checked with the team that names them)")
                continue
            # keys only a team has: with `protocol` misspelt, a team is still checked as one
            if isinstance(data, dict) and TEAM_KEYS & set(data):
                team = load_team(path)
                for spec in team.roles.values():
                    spec.check_grammar()
                print(f"ok  {path}  (team {team.name}: {len(team.roles)} role{'s' * (len(team.roles) != 1)}, protocol {team.config.protocol.type})")
            else:
                role = load_role(path)
                role.check_grammar()
                print(f"ok  {path}  (role {role.name})")
        except ConfigError as exc:
            if args.debug:
                raise
            logs.say(str(exc), "error")
            failed += 1
    return EXIT_USAGE if failed else 0
