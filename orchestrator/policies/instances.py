"""Instances of a role's output schema, for the policies that need no model: the first one
(``builtin:stub``) or a random one (``builtin:random``). One walker serves both, so they accept
the same schemas and honour the same constraints."""
from __future__ import annotations

import math
import random
import re
import string
from collections.abc import Callable
from re import _constants as sre
from re import _parser as sre_parse
from typing import Any

from ..envs.words import WORDS

Pick = Callable[[list], Any]
Scalar = Callable[[str, dict[str, Any]], Any]


def schema_instance(schema: dict[str, Any], pick: Pick, scalar: Scalar, root: dict[str, Any] | None = None) -> Any:
    """An instance of ``schema``: ``pick`` chooses among alternatives (enum values, ``anyOf`` or
    ``oneOf`` branches, a list of types), ``scalar(kind, schema)`` makes a string, number or boolean.
    Objects get their required properties, arrays their ``minItems`` items; a ``$ref`` (local, as
    roles allow) is followed from ``root``, the whole schema."""
    root = root if root is not None else schema
    if str(schema.get("$ref")).startswith("#/"):
        return schema_instance(_resolve(root, schema["$ref"]), pick, scalar, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return pick(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return schema_instance(pick(schema[key]), pick, scalar, root)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = pick(kind)
    if kind == "object":
        props = schema.get("properties", {})
        return {name: schema_instance(props.get(name, {}), pick, scalar, root) for name in schema.get("required", [])}
    if kind == "array":
        return [schema_instance(schema.get("items", {}), pick, scalar, root) for _ in range(schema.get("minItems", 0))]
    if kind == "string" and "pattern" in schema and (text := pattern_instance(schema["pattern"], pick)) is not None:
        return text
    if kind in ("string", "integer", "number", "boolean"):
        return scalar(kind, schema)
    return None


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any]:
    """The subschema a local ``$ref`` (``#/$defs/name``, a JSON pointer) names."""
    node: Any = root
    for part in ref.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


CHARS = "x" + string.ascii_letters + string.digits + string.punctuation + " "  # a character class's candidates, "x" first
CATEGORIES = {sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D", sre.CATEGORY_SPACE: r"\s",
              sre.CATEGORY_NOT_SPACE: r"\S", sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W"}


def pattern_instance(pattern: str, pick: Pick) -> str | None:
    """A string ``pattern`` matches (a made-up one never meets the tester's ``^tests/.+\\.py$``), from
    its parse: each repeat its fewest times, ``pick`` among a branch's alternatives and a character
    class's members; None where that walk does not give one (lookarounds, backreferences)."""

    def member(op: Any, av: Any, char: str) -> bool:
        if op is sre.ANY:
            return char != "\n"
        if op is sre.NOT_LITERAL:
            return ord(char) != av
        if op is not sre.IN:
            raise ValueError(f"no walk through {op}")
        negate = av[:1] == [(sre.NEGATE, None)]
        hit = any(ord(char) == v if o is sre.LITERAL else v[0] <= ord(char) <= v[1] if o is sre.RANGE
                  else re.fullmatch(CATEGORIES[v], char) is not None for o, v in av[negate:])
        return hit != negate

    def walk(nodes: Any) -> str:
        out = []
        for op, av in nodes:
            if op is sre.LITERAL:
                out.append(chr(av))
            elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
                out.append("".join(walk(av[2]) for _ in range(av[0])))
            elif op is sre.SUBPATTERN:
                out.append(walk(av[3]))
            elif op is sre.BRANCH:
                out.append(walk(pick(av[1])))
            elif op is not sre.AT:
                out.append(pick([char for char in CHARS if member(op, av, char)]))
        return "".join(out)

    try:
        text = walk(sre_parse.parse(pattern))
    except (re.error, ValueError, KeyError, IndexError):
        return None
    return text if re.search(pattern, text) else None


def fit_length(text: str, schema: dict[str, Any]) -> str:
    """``text`` repeated up to the schema's ``minLength`` (at least 1) and cut at its ``maxLength``."""
    low, unit = max(1, schema.get("minLength", 1)), text or "x"
    text = (unit * low)[:max(low, len(unit))]
    return text[:schema.get("maxLength", len(text))]


def whole_range(schema: dict[str, Any], low: int = 0, high: int = 100) -> tuple[float, float]:
    """The whole numbers a number schema allows from its bounds (``exclusiveMinimum`` and
    ``exclusiveMaximum`` too); where it sets one side only, ``low``..``high`` moved to meet it.
    Bounds with no whole number between them (a number's 0.1..0.9) give their middle, a float."""
    bottom = {k: schema[k] for k in ("minimum", "exclusiveMinimum") if k in schema}
    top = {k: schema[k] for k in ("maximum", "exclusiveMaximum") if k in schema}
    lo = max((math.ceil(v) if k == "minimum" else math.floor(v) + 1 for k, v in bottom.items()), default=None)
    hi = min((math.floor(v) if k == "maximum" else math.ceil(v) - 1 for k, v in top.items()), default=None)
    if lo is None:
        lo = low if hi is None or low <= hi else hi - (high - low)
    if hi is None:
        hi = high if high >= lo else lo + (high - low)
    if lo > hi:
        lo = hi = (max(bottom.values()) + min(top.values())) / 2
    return lo, hi


def minimal_instance(schema: dict[str, Any]) -> Any:
    """The first choice everywhere, the shortest string, the minimum number, false."""

    def scalar(kind: str, s: dict[str, Any]) -> Any:
        if kind == "string":
            return fit_length("x", s)
        return False if kind == "boolean" else whole_range(s)[0]

    return schema_instance(schema, lambda options: options[0], scalar)


def random_instance(schema: dict[str, Any], context: dict[str, Any], rng: random.Random) -> Any:
    """Uniform choices, a common noun for a string, an integer in the view's ``low``..``high`` (else
    the schema's bounds, else 0..100), a fair coin."""

    def scalar(kind: str, s: dict[str, Any]) -> Any:
        if kind == "string":
            return fit_length(rng.choice(WORDS), s)
        if kind == "boolean":
            return rng.random() < 0.5
        low, high = whole_range(s)
        if isinstance(low, float):  # the middle of a range without whole numbers
            return low
        return rng.randint(int(context.get("low", low)), int(context.get("high", high)))

    return schema_instance(schema, rng.choice, scalar)
