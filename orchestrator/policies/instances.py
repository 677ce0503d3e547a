"""Instances of a role's output schema, for the policies that need no model: the first one
(``builtin:stub``) or a random one (``builtin:random``). One walker serves both, so they accept
the same schemas and honour the same constraints."""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from ..envs.words import WORDS

Pick = Callable[[list], Any]
Scalar = Callable[[str, dict[str, Any]], Any]


def schema_instance(schema: dict[str, Any], pick: Pick, scalar: Scalar) -> Any:
    """An instance of ``schema``: ``pick`` chooses among alternatives (enum values, ``anyOf`` or
    ``oneOf`` branches, a list of types), ``scalar(kind, schema)`` makes a string, number or boolean.
    Objects get their required properties, arrays their ``minItems`` items."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return pick(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return schema_instance(pick(schema[key]), pick, scalar)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = pick(kind)
    if kind == "object":
        props = schema.get("properties", {})
        return {name: schema_instance(props.get(name, {}), pick, scalar) for name in schema.get("required", [])}
    if kind == "array":
        return [schema_instance(schema.get("items", {}), pick, scalar) for _ in range(schema.get("minItems", 0))]
    if kind in ("string", "integer", "number", "boolean"):
        return scalar(kind, schema)
    return None


def fit_length(text: str, schema: dict[str, Any]) -> str:
    """``text`` repeated up to the schema's ``minLength`` (at least 1) and cut at its ``maxLength``."""
    low, unit = max(1, schema.get("minLength", 1)), text or "x"
    text = (unit * low)[:max(low, len(unit))]
    return text[:schema.get("maxLength", len(text))]


def minimal_instance(schema: dict[str, Any]) -> Any:
    """The first choice everywhere, the shortest string, the minimum number, false."""

    def scalar(kind: str, s: dict[str, Any]) -> Any:
        if kind == "string":
            return fit_length("x", s)
        return False if kind == "boolean" else s.get("minimum", 0)

    return schema_instance(schema, lambda options: options[0], scalar)


def random_instance(schema: dict[str, Any], context: dict[str, Any], rng: random.Random) -> Any:
    """Uniform choices, a common noun for a string, an integer in the view's ``low``..``high`` (else
    the schema's bounds, else 0..100), a fair coin."""

    def scalar(kind: str, s: dict[str, Any]) -> Any:
        if kind == "string":
            return fit_length(rng.choice(WORDS), s)
        if kind == "boolean":
            return rng.random() < 0.5
        return rng.randint(int(context.get("low", s.get("minimum", 0))), int(context.get("high", s.get("maximum", 100))))

    return schema_instance(schema, rng.choice, scalar)
