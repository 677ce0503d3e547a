"""Role messages: the envelope, tolerant JSON extraction, and cached schema validation."""
from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import jsonschema
import jsonschema_rs
from pydantic import BaseModel, ConfigDict, Field

from .yamlfile import LONE_SURROGATE, is_unicode, too_deep

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


class _NotJsonNumber(ValueError):
    """NaN, Infinity (not JSON) or a number past 1.8e308, which Python's json reads as nan or inf."""


def _no_constant(text: str) -> float:
    raise _NotJsonNumber(text)


def _number(text: str) -> float | int:
    """A JSON number with a fraction or an exponent; an int where it is whole (the validator takes
    444.0 for an "integer", which the environments' isinstance(value, int) then called no answer)."""
    if math.isinf(value := float(text)):
        raise _NotJsonNumber(text)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


# The validator reads nan and inf as null: it refused them as "null is not of type "number"" and
# took them where a value was free, into the environment and the transcript.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_number)
# Characters kept of one validation error: it quotes the value, and a 1 MB string would go back whole
# in the retry prompt (and into the transcript beside the reply that holds it).
MAX_ERROR_CHARS = 400
# Levels of a reply's JSON: jsonschema-rs reads 255 at most, but only where the schema descends;
# a reply 975 deep under {"type": "object"} passed, and the next role's prompt (tojson of the
# history) ran out of Python's stack: the episode an error, not the reply invalid.
MAX_DEPTH = 255


class Message(BaseModel):
    """One role's turn as the other roles and the transcript see it."""

    model_config = ConfigDict(extra="forbid")
    id: str
    episode: str
    turn: int
    sender: str
    recipients: list[str]
    content: dict[str, Any] | None
    raw: str
    valid: bool
    errors: list[str] = Field(default_factory=list)
    created: float = Field(default_factory=time.time)


def extract_json(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The first JSON object in ``text``: fenced blocks first, then anywhere in the chatter.

    Returns ``(object, None)`` or ``(None, reason)``.
    """
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    not_a_number = None
    for chunk in candidates:
        start = chunk.find("{")
        while start != -1:
            try:
                value, _ = _DECODER.raw_decode(chunk, start)
            except ValueError as exc:  # malformed, or an integer past Python's 4300-digit limit (not a JSONDecodeError)
                if isinstance(exc, _NotJsonNumber):
                    not_a_number = not_a_number or str(exc)
                start = chunk.find("{", start + 1)
                continue
            except RecursionError:  # a degenerate reply ('{"a": [[[[...') a thousand levels deep
                return None, "the reply's JSON is nested too deeply"
            return value, None  # an object: decoding starts at a "{"
    if not_a_number:
        return None, f"the reply's JSON holds {not_a_number[:20]}, which is not a finite number"
    if "{" in text:
        return None, "the reply contains no well-formed JSON object (check quotes, commas and braces)"
    return None, "the reply contains no JSON object"


@lru_cache(maxsize=256)
def _validator_for(schema_json: str) -> jsonschema_rs.Validator:
    return jsonschema_rs.validator_for(json.loads(schema_json))


def schema_json(schema: dict[str, Any]) -> str:
    """The canonical JSON text of a schema (a cache key): keywords sorted, property order kept.

    Sorting every key would reorder ``properties``, and constrained decoders (xgrammar, vLLM's
    structured outputs) write properties in declared order: the judge would give its reason
    before its winner, and a reply_prefix naming the first property would no longer fit.
    """
    return json.dumps(_canonical(schema, False), separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any, is_property_map: bool) -> Any:
    if isinstance(value, dict):
        if is_property_map:  # property name -> subschema, in the message's order
            return {k: _canonical(v, False) for k, v in value.items()}
        return {k: _canonical(value[k], k in ("properties", "patternProperties")) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v, False) for v in value]
    return value


def compile_validator(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """A compiled validator (jsonschema-rs: ~100x the Python library's speed), shared by every
    role whose schema is the same."""
    return _validator_for(schema_json(schema))


def check_schema(schema: dict[str, Any]) -> str | None:
    """``None`` when ``schema`` is a valid JSON Schema, else the reason."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"invalid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
    except RecursionError:  # the checker recurses per level: ~100 levels of a served request's schema were a 500
        return "invalid JSON Schema: nested too deeply"
    if (empty := next((at for at, node in _mappings(schema) if node.get("enum") == []), None)) is not None:
        # 2020-12 allows it; no reply could ever match
        return f"invalid JSON Schema at {'/'.join(map(str, (*empty, 'enum')))}: an empty enum allows no value"
    # a $ref outside the schema: the validator would fetch it
    if remote := next((ref for _, node in _mappings(schema)
                       if isinstance(ref := node.get("$ref"), str) and not ref.startswith("#")), None):
        return f"$ref {remote!r} is not in this schema: only local references (#/$defs/...) resolve, nothing is fetched"
    try:
        compile_validator(schema)  # a local $ref to nowhere shows only here (every reply would fail on it)
    except jsonschema_rs.ValidationError as exc:
        return f"invalid JSON Schema: {exc.message}"
    return None


def _mappings(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    """Every mapping under ``node`` (itself included), with the keys and indexes that lead to it."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _mappings(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _mappings(value, (*path, i))


def validation_errors(validator: jsonschema_rs.Validator, content: Any, limit: int = 3) -> list[str]:
    try:
        if validator.is_valid(content):  # the fast path: no error objects built
            return []
        errors = sorted(validator.iter_errors(content), key=_path_order)[:limit]
    except ValueError:  # jsonschema-rs reads an instance 255 levels deep at most: "Recursion limit reached"
        return ["the reply's JSON is nested too deeply"]
    return [_shorten(f"at {_json_path(e.instance_path, content)}: {e.message}") for e in errors]


def _path_order(error: Any) -> list[tuple[int, int | str]]:
    """Where an error is, in document order: an array's items by index ([2] before [10])."""
    return [(0, p) if isinstance(p, int) else (1, str(p)) for p in error.instance_path]


def _shorten(error: str) -> str:
    """``error`` cut in the middle past MAX_ERROR_CHARS: its place and what was wrong stay."""
    if len(error) <= MAX_ERROR_CHARS:
        return error
    half = MAX_ERROR_CHARS // 2
    return f"{error[:half]}... ({len(error) - 2 * half} characters left out) ...{error[-half:]}"


def _json_path(parts: Any, content: Any) -> str:
    """``$.key[index]...``: jsonschema-rs gives a key that reads as a number ("1") as an int, which
    is an index only where ``content`` holds a list (the property "1" read as ``$[1]``, an item)."""
    path, at = "$", content
    for p in parts:
        if isinstance(at, list):
            path, at = f"{path}[{p}]", at[p]
        else:
            path, at = f"{path}.{p}", at.get(str(p)) if isinstance(at, dict) else None
    return path


def parse_message(text: str, validator: jsonschema_rs.Validator) -> tuple[dict[str, Any] | None, list[str]]:
    """Extract and validate; ``(content, [])`` when valid, else ``(content_or_None, errors)``."""
    content, reason = extract_json(text)
    if content is None:
        return None, [reason or "no JSON object"]
    if not is_unicode(json.dumps(content, ensure_ascii=False)):
        return content, [f"a string holds {LONE_SURROGATE}"]
    if too_deep(content, MAX_DEPTH):
        return content, ["the reply's JSON is nested too deeply"]
    return content, validation_errors(validator, content)
