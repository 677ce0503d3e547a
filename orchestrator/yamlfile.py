"""Loading untrusted config files: YAML that remembers where every key came from (so errors can
name FILE:LINE), and JSON lines.

Role, team, task and replay files come from users, so every reader here is bounded: a size cap
(read at most that many bytes), a nesting-depth cap and, for YAML, a cap on what aliases expand
to. Aliases stay allowed (``<<: *defaults`` is handy), but the composer counts the nodes each
anchor expands to (memoised per node, so counting is linear in the file) and refuses a file
whose aliases add more than :data:`MAX_ALIAS_NODES` nodes, or an alias inside its own anchor,
before anything is constructed or walked. A "billion laughs" file fails in milliseconds.
"""
from __future__ import annotations

import codecs
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

Loc = tuple[str | int, ...]

# Pure-Python YAML parses well under 1 MB/s on a small machine: the cap keeps a file to seconds.
MAX_YAML_BYTES = 1 << 20
MAX_JSONL_BYTES = 32 << 20  # json is C: replay and task lists may be long
MAX_DEPTH = 64  # nested nodes; real files stay under 20
MAX_ALIAS_NODES = 100_000  # nodes that aliases add, counted as if expanded
MERGE_TAG = "tag:yaml.org,2002:merge"
STR_TAG = "tag:yaml.org,2002:str"
_KINDS = {f"tag:yaml.org,2002:{tag}": kind for tag, kind in (
    ("bool", "true or false"), ("int", "a number"), ("float", "a number"), ("null", "null"), ("timestamp", "a date"))}


@dataclass
class YamlDoc:
    data: Any
    path: Path
    lines: dict[Loc, int] = field(default_factory=dict)
    inline: bool = False  # given in code (``inline_doc``): no file, no lines

    def line_of(self, loc: Loc) -> int | None:
        """Line of the deepest existing key on ``loc`` (a missing key points at its parent)."""
        if self.inline:
            return None
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return 1

    def error(self, loc: Loc, problem: str) -> ConfigError:
        return ConfigError(self.path.name if self.inline else self.path, self.line_of(loc), format_loc(loc), problem)

    def file(self, loc: Loc, name: str) -> Path:
        """The file that ``name``, at ``loc``, names: relative to this file's folder."""
        if why := unnameable(name):
            raise self.error(loc, why)
        return (self.path.parent / name).resolve()


def unnameable(name: str) -> str | None:
    """Why ``name`` can name no file on this system, or None. A NUL (a "\\0" in a quoted string) was
    a ValueError traceback; a character the file system's encoding lacks (é where it is ASCII: a C
    locale with PYTHONUTF8=0) was a UnicodeEncodeError traceback, or "not an existing file"."""
    if "\0" in name:
        return f"{name!r} holds a NUL character, which no file name can"
    try:
        os.fsencode(name)
    except UnicodeEncodeError:
        return (f"{name!r} cannot be a file name under this locale: the file system encoding is "
                f"{sys.getfilesystemencoding()}; run with PYTHONUTF8=1 or a UTF-8 locale (LANG=C.UTF-8)")
    return None


def inline_doc(data: Any, name: str) -> YamlDoc:
    """A mapping given in code (``rolecast.run({...})``) read as a file named ``name`` in the
    current folder: relative paths in it resolve from there, and errors read ``name: KEY: problem``."""
    try:
        copy = plain_copy(data)
    except ValueError as exc:
        raise ConfigError(name, None, "(root)", str(exc)) from None
    return YamlDoc(data=copy, path=Path.cwd() / name, inline=True)


def plain_copy(data: Any) -> Any:
    """A deep copy of ``data`` in JSON's own types (a tuple as a list, a numpy number as a number), which
    YAML and JSON files can hold; a ValueError where it holds what they cannot (a Path, a set, a
    lone surrogate: what argv's bytes that are not UTF-8 decode to under LC_ALL=C, which reached
    the tokenizer as a TypeError in every episode)."""
    try:
        text = json.dumps(data, default=_numpy_number, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not plain data (mappings, lists, strings, numbers): {exc}") from None
    if not is_unicode(text):
        raise ValueError("text that is not valid Unicode (a lone surrogate: bytes the locale could not decode; "
                         "run in a UTF-8 locale)")
    return json.loads(text)


def _numpy_number(value: Any) -> Any:
    """A numpy scalar (np.float32(0.5) from a sweep's grid) as Python's own number."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def read_text(path: Path, limit: int) -> str:
    """The UTF-8 text of ``path``, less the byte order mark Windows editors start it with (json
    refused it: a schema or JSON-lines file saved in Notepad was "Unexpected UTF-8 BOM");
    ConfigError if missing, unreadable, over ``limit`` bytes, or not UTF-8 (at the line of the
    first byte that is not: a Latin-1 "é" in a role's system prompt was named by its byte offset alone)."""
    try:
        with path.open("rb") as f:
            raw = f.read(limit + 1)  # not stat(): a FIFO or /dev/zero has no honest size
    except FileNotFoundError:
        raise ConfigError(path, None, "(file)", "file not found") from None
    except OSError as exc:
        raise ConfigError(path, None, "(file)", f"cannot read: {exc}") from None
    if len(raw) > limit:
        raise ConfigError(path, None, "(file)", f"file is larger than {limit >> 20} MiB")
    raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, raw.count(b"\n", 0, exc.start) + 1, "(file)", f"cannot read: {exc}") from None


def load_yaml(path: str | Path) -> YamlDoc:
    """Parse one YAML document with the safe loader, within the caps above."""
    path = Path(path)
    text = read_text(path, MAX_YAML_BYTES)
    try:
        loader = _BoundedLoader(text)
    except yaml.reader.ReaderError as exc:  # a control character: the reader checks the whole text before it parses
        raise ConfigError(path, text.count("\n", 0, exc.position) + 1, "(yaml)",
                          f"invalid YAML: unacceptable character #x{exc.character:04x}: {exc.reason}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(path, 1, "(file)", "file is empty")
        doc = YamlDoc(data=None, path=path)
        _index(node, (), doc)
        doc.data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:  # syntax, a tag the safe loader refuses, or a cap
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem if isinstance(exc, _Refused) else f"invalid YAML: {exc.problem or exc}"
        raise ConfigError(path, line, "(yaml)", problem) from None
    finally:
        loader.dispose()
    return doc


class _Refused(yaml.MarkedYAMLError):
    """Well-formed YAML that breaks a cap."""


class _BoundedLoader(yaml.SafeLoader):
    """A safe loader whose composer enforces :data:`MAX_DEPTH` and :data:`MAX_ALIAS_NODES`."""

    def __init__(self, text: str):
        super().__init__(text)
        self._depth = 0
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it expands to, itself included

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            self._count_alias(node, event.start_mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = 1 + sum(self._sizes[id(child)] for child in _children(node))
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # a scalar its tag cannot make (a date 2024-02-30, a number 0x_, an explicit !!timestamp x)
        # was the constructor's ValueError or AttributeError traceback, naming no file or line
        try:
            return super().construct_object(node, deep)
        except (ValueError, AttributeError):
            raise yaml.constructor.ConstructorError(None, None, f"{node.value!r} is not {_KINDS.get(node.tag, node.tag)}: "
                                                    "quote it to keep it as text", node.start_mark) from None

    def _count_alias(self, node: yaml.Node, mark: yaml.Mark) -> None:
        size = self._sizes.get(id(node))
        if size is None:  # its anchor is still being composed
            raise _Refused(problem="alias refers to a node that contains it", problem_mark=mark)
        self._alias_nodes += size
        if self._alias_nodes > MAX_ALIAS_NODES:
            raise _Refused(problem=f"aliases expand to more than {MAX_ALIAS_NODES} nodes", problem_mark=mark)


# YAML 1.1, which PyYAML reads, has no float without a dot: a learning rate of 1e-4 was the text
# '1e-4', recorded as text and passed as text to every option not typed as a number. YAML 1.2's is.
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def read_value(text: str) -> Any:
    """One value written as YAML (``--set KEY=VALUE``'s), read as a file's values are."""
    return yaml.load(text, Loader=_BoundedLoader)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return node.value if isinstance(node, yaml.SequenceNode) else []


def _index(node: yaml.Node, loc: Loc, doc: YamlDoc) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, (key_node, value_node) in _pairs(node, loc, doc).items():
            doc.lines[loc + (key,)] = key_node.start_mark.line + 1
            _check_unicode(key, key_node, loc + (key,), doc)
            _index(value_node, loc + (key,), doc)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            doc.lines[loc + (i,)] = item.start_mark.line + 1
            _index(item, loc + (i,), doc)
    else:
        _check_unicode(node.value, node, loc, doc)


LONE_SURROGATE = "a lone surrogate escape (\\ud800-\\udfff without its pair): not valid Unicode"


def is_unicode(text: str) -> bool:
    """False for a string holding a lone surrogate: an escape (YAML's or JSON's "\\udcff") makes
    one, and no tokenizer or UTF-8 file takes it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_unicode(text: str, node: yaml.Node, loc: Loc, doc: YamlDoc) -> None:
    # it reached the writer of the run's config.yaml: a traceback after the recipe had loaded
    if not is_unicode(text):
        raise ConfigError(doc.path, node.start_mark.line + 1, format_loc(loc), LONE_SURROGATE)


def _pairs(node: yaml.MappingNode, loc: Loc, doc: YamlDoc) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """The keys of a mapping, with those a merge key (``<<: *defaults``) brings in where it gives
    no key of its own: a merged key is named at its line in the anchor, not at the file's line 1."""
    pairs: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    merged: list[yaml.Node] = []
    for key_node, value_node in node.value:
        key = str(key_node.value)
        if key_node.tag not in (STR_TAG, MERGE_TAG):  # `on:` is true, `1:` a number: config keys are text
            scalar = isinstance(key_node, yaml.ScalarNode)
            raise ConfigError(doc.path, key_node.start_mark.line + 1, format_loc(loc + ((key,) if scalar else ())),
                              f'YAML reads this key as {_KINDS.get(key_node.tag, "no text")}: quote it ("{key}")'
                              if scalar else "a key must be text, not a mapping or list")
        if key in pairs or key_node.tag == MERGE_TAG and merged:
            raise ConfigError(doc.path, key_node.start_mark.line + 1, format_loc(loc + (key,)), "duplicate key")
        if key_node.tag == MERGE_TAG:  # a mapping or a list of them, the first one's keys winning
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        else:
            pairs[key] = (key_node, value_node)
    for source in merged:
        if isinstance(source, yaml.MappingNode):  # anything else the constructor refuses
            for key, pair in _pairs(source, loc, doc).items():
                pairs.setdefault(key, pair)
    return pairs


def not_json(value: Any, loc: Loc = ()) -> tuple[Loc, str] | None:
    """Where in ``value`` and what is not JSON data (YAML's dates, binary, sets), or None."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return loc + (key,), f"a key must be text, not {type(key).__name__}"
            if found := not_json(item, loc + (key,)):
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if found := not_json(item, loc + (i,)):
                return found
    elif not (value is None or isinstance(value, (str, int, float))):
        return loc, f"a {type(value).__name__} is not JSON data: quote it to keep it as text (got {value!r})"
    return None


def load_json_lines(path: str | Path) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSON-lines file, within the caps."""
    path = Path(path)
    text = read_text(path, MAX_JSONL_BYTES)
    return [(n, _parse_json(raw, path, n)) for n, raw in enumerate(text.split("\n"), 1) if raw.strip()]


def json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: a key given twice is a ValueError, as in YAML (json
    keeps the last one without a word)."""
    out = dict(pairs)
    if len(out) < len(pairs):
        keys = [key for key, _ in pairs]
        raise ValueError(f"duplicate key {next(key for i, key in enumerate(keys) if key in keys[:i])!r}")
    return out


def _parse_json(raw: str, path: Path, line: int) -> Any:
    try:
        value = json.loads(raw, object_pairs_hook=json_object)
        deep = too_deep(value)
    except RecursionError:  # json's C decoder gives up near 1000 levels
        deep = True
    except ValueError as exc:
        raise ConfigError(path, line, "(json)", f"not valid JSON: {exc}") from None
    if deep:
        raise ConfigError(path, line, "(json)", f"nested deeper than {MAX_DEPTH} levels")
    # the text is UTF-8, so only an escape makes a surrogate: the full check only for lines with one
    if "\\u" in raw and not is_unicode(json.dumps(value, ensure_ascii=False)):
        raise ConfigError(path, line, "(json)", LONE_SURROGATE)
    return value


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests more than ``limit`` levels, counted as YAML nodes are."""
    stack = [(value, 1)]
    while stack:  # not recursive: the value may be ~1000 levels deep
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack += [(child, depth + 1) for child in children]
    return False
