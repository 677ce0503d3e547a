"""builtin:stub's and builtin:random's replies without a model: instances of the role's schema,
valid against it whatever constraint the schema sets (one walker serves both)."""
from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace

import jsonschema
import pytest
from orchestrator.envs.tictactoe import EMPTY
from orchestrator.errors import PolicyError
from orchestrator.policies.base import PolicyRequest
from orchestrator.policies.baselines import BinarySearchPolicy, MinimaxPolicy, RandomPolicy
from orchestrator.policies.instances import fit_length, minimal_instance, pattern_instance, random_instance
from orchestrator.policies.stub import StubPolicy

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


def test_the_stub_takes_the_first_choice_and_the_least_of_everything():
    schema = {"type": "object", "$defs": {"a/b": {"const": "slash"}, "a~1b": {"const": "escaped"}},
              "properties": {"code": {"type": "string", "pattern": "^[^xa][b-d][^x]\\d*-$"},
                             "pick": {"oneOf": [{"type": "integer", "minimum": 3}, {"const": "none"}]},
                             "tags": {"type": "array", "items": {"type": "string"}},
                             "word": {"type": "string", "minLength": 0}, "cap": {"type": "integer", "maximum": 50},
                             "mid": {"type": "number", "minimum": 0.1, "maximum": 0.9},
                             "ref": {"$ref": "#/$defs/a~01b"}, "branch": {"$ref": "#/properties/pick/oneOf/1"},
                             "optional": {"type": "string"}},
              "required": ["code", "pick", "tags", "word", "cap", "mid", "ref", "branch"]}
    # a negated class, a range and a repeat at their least; no optional property, no array items unasked;
    # a string 1 long at least; 0 in 0..100 met at one side; a middle where no whole number fits;
    # a JSON pointer's ~01 is "~1" (not "/"), and a number in it indexes a list
    assert minimal_instance(schema) == {"code": "bba-", "pick": 3, "tags": [], "word": "x", "cap": 0, "mid": 0.5,
                                        "ref": "escaped", "branch": "none"}
    jsonschema.validate(minimal_instance(schema), schema)


def test_a_pattern_the_walk_cannot_meet_gives_none_and_random_strings_repeat_to_their_length():
    first = lambda options: options[0]  # noqa: E731
    assert pattern_instance("a\\bb", first) is None  # the walk skips \b: "ab", which does not match
    assert pattern_instance("[éè]", first) is None  # no candidate character: nothing to pick from
    assert fit_length("cat", {"minLength": 5}) == "catca"


def test_random_instances_spread_over_a_list_of_types_and_both_booleans():
    rng = random.Random(2)
    schema = {"type": "object", "properties": {"y": {"type": ["string", "null"]}, "b": {"type": "boolean"}},
              "required": ["y", "b"]}
    replies = [random_instance(schema, {}, rng) for _ in range(40)]
    assert {type(r["y"]) for r in replies} == {str, type(None)} and {r["b"] for r in replies} == {True, False}


def test_random_instances_send_required_properties_only_in_the_schemas_bounds():
    """As docs/environments.md says of `builtin:random`: an optional field is never sent, and an
    integer without the view's low..high is in the schema's bounds, else 0..100."""
    rng = random.Random(3)
    schema = {"type": "object", "properties": {"price": {"type": "integer", "minimum": 150, "maximum": 152},
                                               "n": {"type": "integer"}, "note": {"type": "string"}},
              "required": ["price", "n"]}
    replies = [random_instance(schema, {}, rng) for _ in range(60)]
    assert all(r.keys() == {"price", "n"} for r in replies)
    assert {r["price"] for r in replies} == {150, 151, 152} and all(0 <= r["n"] <= 100 for r in replies)


def reply(policy, context: dict, seed: int = 0) -> dict:
    request = PolicyRequest(role="r", episode="e", episode_index=0, turn=0, attempt=0, messages=[],
                            context=context, sampling=None, adapter=None, seed=seed)
    out = asyncio.run(policy(request))
    return json.loads(getattr(out, "text", out))


def test_the_stub_replies_its_roles_smallest_instance():
    assert reply(StubPolicy(SimpleNamespace(schema=SCHEMAS[3])), {}) == minimal_instance(SCHEMAS[3])


# the move goes in the first required property of the kind: "confidence" or "reason" had held it
MOVE_SCHEMA = {"type": "object", "properties": {"confidence": {"type": "integer"}, "reason": {"type": "string"},
                                                "move": {"type": "string"}, "guess": {"type": "integer"}},
               "required": ["confidence", "move", "reason", "guess"]}
BOARD = {"board": [EMPTY] * 9, "mark": "X"}  # every first move draws: a tie among all nine


def test_the_baselines_put_the_move_in_the_schemas_first_required_field_of_its_kind():
    spec = SimpleNamespace(schema=MOVE_SCHEMA)
    assert reply(RandomPolicy(spec), {"legal_moves": ["a1"]}) == {"move": "a1"}
    assert list(reply(MinimaxPolicy(spec), BOARD)) == ["move"]
    assert reply(BinarySearchPolicy(spec), {"low": 1, "high": 3, "history": []}) == {"confidence": 2}


def test_minimax_breaks_ties_at_random_by_the_seed():
    policy = MinimaxPolicy(SimpleNamespace(schema=MOVE_SCHEMA))
    moves = [reply(policy, BOARD, seed)["move"] for seed in range(40)]
    assert len(set(moves)) > 3 and moves == [reply(policy, BOARD, seed)["move"] for seed in range(40)]


@pytest.mark.parametrize("policy, needs", [(MinimaxPolicy, "board, mark"), (BinarySearchPolicy, "low, high, history")])
def test_a_baseline_in_the_wrong_game_says_what_it_needs(policy, needs):
    with pytest.raises(PolicyError, match=f"needs the environment to provide {needs}: wrong game"):
        reply(policy(SimpleNamespace(schema=MOVE_SCHEMA)), {"legal_moves": ["a1"]})
