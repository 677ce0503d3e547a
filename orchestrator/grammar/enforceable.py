"""What constrained decoding cannot hold a reply to, refused before a schema is compiled.

xgrammar (0.2) leaves some JSON Schema keywords out of its grammar without a word: a constrained
reply may break them, is then invalid, retried and penalised, every time. Others it compiles
wrongly (a literal quote in a pattern comes out unescaped) or only slowly. Each is named here
with where it sits in the schema, so the role's file says what to change (or ``decoding: free``).
"""
from __future__ import annotations

import re
from typing import Any

import jsonschema
from referencing.exceptions import Unresolvable

from .errors import GrammarError

# Keywords the grammar leaves out (checked against xgrammar's grammars: replies broke each).
IGNORED = {
    "uniqueItems": "repeated items",
    "not": "what it excludes",
    "if": "the branch it selects",
    "dependentRequired": "the keys it makes required",
    "dependentSchemas": "the schemas it applies",
    "dependencies": "the keys and schemas it requires",  # drafts 4-7's; the validator holds replies to it whatever the draft
    "contains": "an array without such an item",
}
# Beside these the grammar keeps only them, dropping minLength / maxLength.
_SHAPED = ("pattern", "format")
_ANNOTATIONS = {"description", "title", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly"}
# Keys that hold no constraint on the value itself: a root "$ref" beside its "$defs" (pydantic's
# recursive models) is compiled whole, and so is a oneOf beside OpenAPI's "discriminator" (pydantic's
# tagged unions).
_NOT_CONSTRAINTS = _ANNOTATIONS | {"$defs", "definitions", "$schema", "$id", "discriminator"}
# Formats xgrammar spells with invalid JSON: email's quoted local part takes a raw backslash pair
# (the JSON text "\"a\q\"@b" holds the escape \q), json-pointer's characters raw quotes and control characters.
BROKEN_FORMATS = ("email", "json-pointer", "relative-json-pointer")
# Drafts 4 to 7 have the validator (jsonschema-rs) check a format, by rules looser in xgrammar's
# patterns: 2024-02-30 is written as a date and refused; 2019-09 and later take format as a note.
_FORMAT_CHECKED = re.compile(r"json-schema\.org/draft-0[4-7]/schema")
MAX_REPEAT = 128  # xgrammar's compiler fails on a regex repetition bound above this (per_rule_fsm_hashes)
MAX_MIN_LENGTH = 100  # a minLength alone is spelled a character at a time: 200 took 7 s to compile, 2000 65 s
_BOUNDS = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
_RANGE = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_LOOKAHEAD = re.compile(r"(?<!\\)\(\?[=!]")  # xgrammar drops these (a warning on stderr), matching as if absent
_QUOTE_ESCAPE = re.compile(r"\\(x22|u0022|x5c|u005c)", re.IGNORECASE)  # a quote or backslash spelled as an escape


def check_enforceable(schema: Any, at: str = "", root: Any = None) -> None:
    """Raise GrammarError at the first keyword of ``schema`` (a parsed JSON Schema) that
    constrained decoding would not enforce; ``at`` is where the schema sits in ``root``, the whole."""
    if not isinstance(schema, dict):
        return
    root = schema if root is None else root
    where = at or "the schema"
    for key, lost in IGNORED.items():
        if key in schema and not (key == "uniqueItems" and schema[key] is False):
            raise GrammarError(f"{where}: constrained decoding cannot enforce {key!r} (xgrammar leaves it out, "
                               f"so replies may hold {lost})")
    if "$ref" in schema and (extra := sorted(set(schema) - _NOT_CONSTRAINTS - {"$ref"})):
        raise GrammarError(f"{where}: constrained decoding ignores {', '.join(extra)} beside $ref: "
                           "move them into the referenced schema")
    for key in ("anyOf", "oneOf", "allOf"):  # xgrammar compiles the branches alone, even "type" beside them
        if key in schema and (extra := sorted(set(schema) - _NOT_CONSTRAINTS - {key})):
            raise GrammarError(f"{where}: constrained decoding ignores {', '.join(extra)} beside {key}: "
                               "move them into each branch")
    # xgrammar writes a oneOf it cannot prove exclusive as an anyOf: a reply matching two branches was allowed and refused
    branches = schema["oneOf"] if isinstance(schema.get("oneOf"), list) else []
    if pair := next(((i, j) for j in range(len(branches)) for i in range(j)
                     if not _disjoint(branches[i], branches[j], root)), None):
        raise GrammarError(f"{where}: constrained decoding enforces oneOf as anyOf, and oneOf[{pair[0]}] and "
                           f"oneOf[{pair[1]}] may both match a value (which oneOf refuses): give them different "
                           "types, or each a required property with its own const, or use anyOf")
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        raise GrammarError(f"{where}: constrained decoding enforces allOf with one branch only: merge the branches")
    declared = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    if isinstance(schema.get("required"), list) and (missing := [k for k in schema["required"] if k not in declared]):
        raise GrammarError(f"{where}: required {missing[0]!r} is not in properties: constrained decoding writes only "
                           "declared properties, so no reply would hold it")
    # xgrammar counts an object's keys, not its distinct ones, and may write a free key twice: JSON
    # keeps one, and {"x": 1, "x": 2} breaks a minProperties 2 that it was written to keep
    free = schema.get("additionalProperties") not in (None, False) or "patternProperties" in schema
    required = len(set(schema["required"])) if isinstance(schema.get("required"), list) else 0
    if free and isinstance(least := schema.get("minProperties"), int) and least - required >= 2:
        raise GrammarError(f"{where}: constrained decoding may write a free key twice (JSON keeps one), so it cannot "
                           f"enforce minProperties {least} with {required} required: require more properties, or "
                           f"lower minProperties to {required + 1}")
    values = schema["enum"] if isinstance(schema.get("enum"), list) else [schema["const"]] if "const" in schema else []
    if values and set(schema) - _NOT_CONSTRAINTS - {"enum", "const"}:  # xgrammar writes every value, whatever beside
        check = jsonschema.Draft202012Validator(schema)
        try:
            broken = [v for v in values if not check.is_valid(v)]
        except Unresolvable:  # a $ref into the whole schema: not checked here
            broken = []
        if broken:
            raise GrammarError(f"{where}: constrained decoding writes every {'enum' if 'enum' in schema else 'const'} "
                               f"value, and {broken[0]!r} breaks the keywords beside it: drop it")
    # xgrammar writes an integer past 64 bits as a double: 10**30 becomes 1e+30, another number to the validator
    if (big := next((n for n in _integers(values) if not -2**63 <= n < 2**63 and float(n) != n), None)) is not None:
        raise GrammarError(f"{where}: constrained decoding writes the integer {big} as {float(big)!r}, which is not "
                           "equal to it: keep enum and const integers within 64 bits")
    step = schema.get("multipleOf")
    if isinstance(step, (int, float)) and (schema.get("type") != "integer" or not float(step).is_integer()):
        raise GrammarError(f"{where}: constrained decoding enforces multipleOf only as a whole number on an integer")
    if "multipleOf" in schema and (bounds := [k for k in _RANGE if k in schema]):  # xgrammar spells the range alone
        raise GrammarError(f"{where}: constrained decoding drops multipleOf beside {bounds[0]}: list the values in an enum")
    if "integer" in (schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]):
        for key in _RANGE:  # else xgrammar's "Check failed"
            bound = schema.get(key)
            if isinstance(bound, (int, float)) and not ((isinstance(bound, int) or bound.is_integer())
                                                         and -2**63 <= bound < 2**63):
                raise GrammarError(f"{where}: constrained decoding takes an integer's {key} only as a whole number "
                                   f"within 64 bits, not {bound!r}")
    shaped = [k for k in _SHAPED if k in schema]
    lengths = [k for k in ("minLength", "maxLength") if k in schema]
    if shaped and lengths:
        raise GrammarError(f"{where}: constrained decoding drops {' and '.join(lengths)} beside {shaped[0]}: "
                           "bound the length in the pattern ({m,n})")
    if isinstance(schema.get("minLength"), int) and "maxLength" not in schema and schema["minLength"] > MAX_MIN_LENGTH:
        raise GrammarError(f"{where}: minLength {schema['minLength']} without a maxLength takes minutes to compile "
                           f"(above {MAX_MIN_LENGTH}): give a maxLength too")
    if schema.get("format") in BROKEN_FORMATS:
        raise GrammarError(f"{where}: constrained decoding writes format {schema['format']!r} as invalid JSON "
                           "(raw backslashes, quotes or control characters): use a pattern")
    if "format" in schema and _FORMAT_CHECKED.search(str(root.get("$schema", ""))):
        raise GrammarError(f"{where}: constrained decoding writes format {schema['format']!r} by looser rules than "
                           f"the validator of {root['$schema']} checks (a date 2024-02-30, an ipv4 01.1.1.1): "
                           "use a pattern, or a $schema of draft 2019-09 or later (format a note)")
    if isinstance(pattern := schema.get("pattern"), str):
        _check_pattern(pattern, where)
    for key, sub in subschemas(schema):
        check_enforceable(sub, f"{at}.{key}" if at else key, root)


def _disjoint(a: Any, b: Any, root: Any) -> bool:
    """Whether no value can match both schemas, as far as types, const/enum values and a
    required property of both (a tagged union's tag) show; False where they do not."""
    a, b = _resolved(a, root), _resolved(b, root)
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not any(x == y or {x, y} <= {"integer", "number"} for x in ta for y in tb):
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not any(_same(x, y) for x in va for y in vb):
        return True
    pa, pb = a.get("properties"), b.get("properties")
    if not (isinstance(pa, dict) and isinstance(pb, dict) and isinstance(a.get("required"), list)
            and isinstance(b.get("required"), list)):
        return False
    return any(k in pa and k in pb and _disjoint(pa[k], pb[k], root) for k in set(a["required"]) & set(b["required"]))


def _resolved(schema: Any, root: Any) -> Any:
    """``schema`` with its local ``$ref``s followed (None where one does not resolve)."""
    for _ in range(32):  # a cycle of $refs resolves to nothing
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str):
            return schema
        if not ref.startswith("#"):
            return None
        schema = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            schema = schema.get(part) if isinstance(schema, dict) else None
    return None


def _values(schema: dict) -> list | None:
    if "const" in schema:
        return [schema["const"]]
    return schema["enum"] if isinstance(schema.get("enum"), list) else None


def _types(schema: dict) -> set[str] | None:
    """The JSON types of the values ``schema`` allows; None where it does not say."""
    values = _values(schema)
    if values is not None:
        return {_type_of(v) for v in values}
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind
    return set(kinds) if isinstance(kinds, list) and all(isinstance(k, str) for k in kinds) else None


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "integer" if float(value).is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "null")


def _same(x: Any, y: Any) -> bool:
    """JSON equality: 1 is 1.0, but not true."""
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(map(_same, x, y))
    return x == y


def _check_pattern(pattern: str, where: str) -> None:
    if '"' in pattern or "\\\\" in pattern or _QUOTE_ESCAPE.search(pattern):
        raise GrammarError(f"{where}: pattern {pattern!r} matches a literal quote or backslash, which constrained "
                           "decoding would write unescaped (invalid JSON)")
    if _LOOKAHEAD.search(pattern):
        raise GrammarError(f"{where}: constrained decoding cannot enforce the lookahead in pattern {pattern!r} "
                           "(xgrammar leaves it out, so replies may break it)")
    for bound in _BOUNDS.finditer(pattern):
        if max(int(bound[1]), int(bound[2] or 0)) > MAX_REPEAT:
            raise GrammarError(f"{where}: pattern {pattern!r} repeats more than {MAX_REPEAT} times, which xgrammar "
                               f"cannot compile: bound it at {MAX_REPEAT} or less")


def _integers(value: Any) -> list[int]:
    """The integers anywhere in a JSON value."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [n for v in value for n in _integers(v)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def subschemas(schema: dict) -> list[tuple[str, Any]]:
    """(path, subschema) of the places a schema holds schemas."""
    out: list[tuple[str, Any]] = []
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(schema.get(key), dict):
            out += [(f"{key}.{name}", sub) for name, sub in schema[key].items()]
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(schema.get(key), list):
            out += [(f"{key}[{i}]", sub) for i, sub in enumerate(schema[key])]
    for key in ("items", "additionalProperties", "additionalItems", "propertyNames"):
        if isinstance(schema.get(key), dict):
            out.append((key, schema[key]))
    return out
