"""YAML loading that remembers where every key came from, so errors can name FILE:LINE."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

Loc = tuple[str | int, ...]


@dataclass
class YamlDoc:
    data: Any
    path: Path
    lines: dict[Loc, int] = field(default_factory=dict)

    def line_of(self, loc: Loc) -> int | None:
        """Line of the deepest existing key on ``loc`` (a missing key points at its parent)."""
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return 1

    def error(self, loc: Loc, problem: str) -> ConfigError:
        return ConfigError(self.path, self.line_of(loc), format_loc(loc), problem)


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_yaml(path: str | Path) -> YamlDoc:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, None, "(file)", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, None, "(file)", f"cannot read: {exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(path, line, "(yaml)", f"invalid YAML: {exc.problem or exc}") from None
    if node is None:
        raise ConfigError(path, 1, "(file)", "file is empty")
    doc = YamlDoc(data=None, path=path)
    _index(node, (), doc)
    try:
        doc.data = yaml.SafeLoader(text).get_single_data()
    except yaml.YAMLError as exc:  # e.g. a tag the safe loader refuses
        raise ConfigError(path, None, "(yaml)", f"invalid YAML: {exc}") from None
    return doc


def _index(node: yaml.Node, loc: Loc, doc: YamlDoc) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            sub = loc + (key,)
            if key in seen:
                raise ConfigError(doc.path, key_node.start_mark.line + 1, format_loc(sub), "duplicate key")
            seen.add(key)
            doc.lines[sub] = key_node.start_mark.line + 1
            _index(value_node, sub, doc)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            doc.lines[loc + (i,)] = item.start_mark.line + 1
            _index(item, loc + (i,), doc)
