"""Helpers the tests import (conftest.py modules are not importable by name across folders)."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

ERROR_LINE = re.compile(r"^(?P<file>[^:\n]+)(?::(?P<line>\d+))?: (?P<key>\S+): (?P<problem>.+)$")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path
