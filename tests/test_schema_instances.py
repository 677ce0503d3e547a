"""builtin:stub's and builtin:random's replies without a model: instances of the role's schema,
valid against it whatever constraint the schema sets (one walker serves both)."""
from __future__ import annotations

import random

import jsonschema
import pytest
from orchestrator.policies.instances import minimal_instance, random_instance

SCHEMAS = [
    {"type": "object", "properties": {"move": {"type": "string", "minLength": 12}}, "required": ["move"]},
    {"type": "object", "properties": {"move": {"type": "string", "maxLength": 2}}, "required": ["move"]},
    {"type": "object", "properties": {"guess": {"type": "integer", "minimum": 5, "maximum": 9}}, "required": ["guess"]},
    {"type": "object", "properties": {"verdict": {"enum": ["pro", "con"]}, "ok": {"type": "boolean"},
                                      "notes": {"type": "array", "items": {"type": "string", "minLength": 3},
                                                "minItems": 2}},
     "required": ["verdict", "ok", "notes"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"anyOf": [{"type": "integer", "minimum": 1}, {"const": "none"}]},
                                      "y": {"type": ["string", "null"], "minLength": 4}},
     "required": ["x", "y"]},
    {"type": "object", "properties": {"path": {"type": "string", "pattern": "^tests/.+\\.py$"},
                                      "id": {"type": "string", "pattern": "^(ab|c)\\d{2}\\s[^x]*\\w+$"}},
     "required": ["path", "id"]},
    {"type": "object", "$defs": {"mood": {"enum": ["calm", "stormy"]}, "note": {"type": "string", "minLength": 3}},
     "properties": {"mood": {"$ref": "#/$defs/mood"}, "notes": {"type": "array", "items": {"$ref": "#/$defs/note"},
                                                                "minItems": 1}},
     "required": ["mood", "notes"]},  # local $refs, which roles allow: {} for each, before
    # one bound, exclusive bounds, a fractional bound of an integer: random's randint(0..100) had an
    # empty range past one bound (a ValueError each turn), the stub gave 0 or the bound itself
    {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1900}, "debt": {"type": "integer", "maximum": -1},
                                      "n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4},
                                      "k": {"type": "integer", "minimum": 0.5}, "p": {"type": "number", "exclusiveMinimum": 2.5},
                                      "q": {"type": "number", "minimum": 0.1, "maximum": 0.9}},
     "required": ["year", "debt", "n", "k", "p", "q"]},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_stub_and_random_instances_satisfy_the_schema(schema):
    jsonschema.validate(minimal_instance(schema), schema)
    rng = random.Random(0)
    for _ in range(50):
        jsonschema.validate(random_instance(schema, {}, rng), schema)


def test_random_integers_follow_the_views_range_and_choices_spread():
    rng = random.Random(1)
    schema = SCHEMAS[2]
    guesses = {random_instance(schema, {"low": 6, "high": 7}, rng)["guess"] for _ in range(40)}
    assert guesses == {6, 7}
    verdicts = {random_instance(SCHEMAS[3], {}, rng)["verdict"] for _ in range(40)}
    assert verdicts == {"pro", "con"}
    assert minimal_instance(SCHEMAS[3]) == {"verdict": "pro", "ok": False, "notes": ["xxx", "xxx"]}
    assert minimal_instance(SCHEMAS[5])["path"] == "tests/x.py"
