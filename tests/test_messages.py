from __future__ import annotations

import pytest

from orchestrator.messages import (MAX_ERROR_CHARS, Message, check_schema, compile_validator, extract_json,
                                   parse_message, schema_json)

SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["approve", "request_changes"]}, "n": {"type": "integer"}},
    "required": ["verdict"],
}


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"verdict": "approve"}', {"verdict": "approve"}),
        ('Sure! Here it is:\n```json\n{"verdict": "approve"}\n```\nHope that helps.', {"verdict": "approve"}),
        ('```\n{"a": {"b": [1, 2, {"c": "}"}]}}\n```', {"a": {"b": [1, 2, {"c": "}"}]}}),
        ('I think {this is not json} but {"ok": true} is', {"ok": True}),
        ('{"text": "unicode é ✓ 😀"}', {"text": "unicode é ✓ 😀"}),
        ('prefix [1, 2] then {"x": 1}', {"x": 1}),
        ('Not {"draft": 1} but:\n```json\n{"final": 2}\n```', {"final": 2}),  # a fenced block before chatter
        ('Not {"draft": 1} but:\n```\n{"final": 2}\n```', {"final": 2}),  # a fence that names no language too
        ('{{"a": 1}', {"a": 1}),  # an object starting at the next character
    ],
)
def test_extract_json_tolerates_fences_and_chatter(text, expected):
    assert extract_json(text) == (expected, None)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("no json here", "no JSON object"),
        ('{"verdict": "approve"', "no well-formed JSON object"),
        ("", "no JSON object"),
        pytest.param('{"a": ' + "[" * 5000, "nested too deeply", id="a model stuck on ["),  # not a RecursionError
        pytest.param('{"guess": 1' + "0" * 5000 + "}", "no well-formed JSON object", id="a model stuck on 0"),
    ],
)
def test_extract_json_failures_say_why(text, reason):
    content, why = extract_json(text)
    assert content is None and reason in why


@pytest.mark.parametrize("number", ["NaN", "-Infinity", "1e999"])
def test_nan_and_infinity_are_invalid_and_say_so(number):
    # Python's json reads them: the validator, seeing null, answered "null is not of type ..." where
    # a type was set, and passed them on (non-JSON into env and transcript) where none was
    free = compile_validator({"type": "object", "properties": {"score": {}}, "required": ["score"]})
    for v in (free, compile_validator(SCHEMA)):
        assert parse_message('{"verdict": "approve", "n": ' + number + ', "score": 1}', v) == \
            (None, [f"the reply's JSON holds {number}, which is not a finite number"])
    assert parse_message('{"score": 1e308}', free) == ({"score": 1e308}, [])
    assert extract_json('{"a": NaN} or {"a": Infinity}') == (None, "the reply's JSON holds NaN, which is not a finite number")
    # the retry prompt quotes 20 characters of a number past float's range, not its 5000 digits
    assert extract_json('{"a": 1.' + "0" * 5000 + 'e999}') == \
        (None, f"the reply's JSON holds 1.{'0' * 18}, which is not a finite number")


def test_a_whole_float_is_an_int():
    # valid for "type": "integer", yet 444.0 failed the environments' isinstance(value, int): a valid
    # answer scored as none (whole_number), a valid guess called illegal (guess_number)
    from orchestrator.envs.base import whole_number

    v = compile_validator({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]})
    content, errors = parse_message('{"answer": 444.0}', v)
    assert errors == [] and content == {"answer": 444} and type(content["answer"]) is int
    message = Message(id="e:0", episode="e", turn=0, sender="a", recipients=[], content=content, raw="", valid=True)
    assert whole_number(message) == 444
    assert parse_message('{"answer": 4.5, "big": 1e300, "n": -2E2}', compile_validator({})) == \
        ({"answer": 4.5, "big": 1e300, "n": -200}, [])
    # past 2**53 a float is no exact integer: kept a float, not written out as 301 made-up digits
    assert type(parse_message('{"big": 1e300}', compile_validator({}))[0]["big"]) is float


def test_validation_errors_name_the_path():
    v = compile_validator(SCHEMA)
    content, errors = parse_message('{"verdict": "maybe", "n": "3"}', v)
    assert content == {"verdict": "maybe", "n": "3"}
    assert errors == [
        'at $.n: "3" is not of type "integer"',
        'at $.verdict: "maybe" is not one of "approve" or "request_changes"',
    ]
    assert parse_message('{"verdict": "approve"}', v) == ({"verdict": "approve"}, [])


def test_a_property_named_by_a_number_is_a_key_not_an_index():
    """jsonschema-rs gives the property "1" as the number 1: the model was told `at $[1]`, an item of
    a list its reply does not have."""
    v = compile_validator({"type": "object", "properties": {"1": {"type": "integer"},
                                                            "a": {"type": "array", "items": {"type": "object",
                                                                  "properties": {"2": {"type": "integer"}}}}}})
    assert parse_message('{"1": "x", "a": [{"2": 3}, {"2": "y"}]}', v)[1] == [
        'at $.1: "x" is not of type "integer"',
        'at $.a[1].2: "y" is not of type "integer"',
    ]


def test_validation_errors_are_the_first_three_and_index_arrays():
    v = compile_validator({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})
    assert parse_message('{"a": [1, "x", "y", "z", "w"]}', v)[1] == [
        'at $.a[1]: "x" is not of type "integer"',
        'at $.a[2]: "y" is not of type "integer"',
        'at $.a[3]: "z" is not of type "integer"',
    ]
    # in the array's order: sorted as text, [10] and [11] came before [2]
    errors = parse_message('{"a": [0, 1, "x", 3, 4, 5, 6, 7, 8, 9, "p", "q"]}', v)[1]
    assert [e.split(":")[0] for e in errors] == ["at $.a[2]", "at $.a[10]", "at $.a[11]"]


def test_a_schema_without_dollar_schema_is_draft_2020_12():
    # jsonschema-rs before 0.25 read it as Draft 7: prefixItems and dependentRequired were ignored
    # and such replies passed as valid
    v = compile_validator({"type": "object", "dependentRequired": {"a": ["b"]},
                           "properties": {"a": {"type": "array", "prefixItems": [{"type": "integer"}]}}})
    assert parse_message('{"a": ["x"], "b": 1}', v)[1] and parse_message('{"a": [1]}', v)[1]
    assert parse_message('{"a": [1], "b": 1}', v)[1] == []


def test_a_value_nested_past_the_validators_depth_is_invalid():
    # jsonschema-rs raises ValueError past 255 levels: about 260 SmolLM2 tokens of "[[[[...]]]]"
    v = compile_validator(SCHEMA)
    _, errors = parse_message('{"verdict": "approve", "n": ' + "[" * 300 + "]" * 300 + "}", v)
    assert errors == ["the reply's JSON is nested too deeply"]


def test_a_value_nested_past_the_validators_depth_is_invalid_whatever_the_schema():
    # the validator descends only where the schema does: under {"type": "object"} a reply 975 deep
    # passed, and the next prompt's tojson of it ran out of Python's stack (the episode an error)
    v = compile_validator({"type": "object"})
    deep = '{"n": ' + "[" * 255 + "]" * 255 + "}"  # 256 levels, the object one of them
    assert parse_message(deep, v)[1] == ["the reply's JSON is nested too deeply"]
    assert parse_message('{"n": ' + "[" * 254 + "]" * 254 + "}", v)[1] == []


def test_a_lone_surrogate_escape_is_invalid_and_a_pair_is_fine():
    # it would reach the transcript (a UTF-8 file) and the next prompts' tokenizer, and crash both
    v = compile_validator(SCHEMA)
    _, errors = parse_message('{"verdict": "approve", "comments": ["a\\udcffb"]}', v)
    assert errors and "lone surrogate" in errors[0] and "\udcff" not in errors[0]
    assert parse_message('{"verdict": "approve", "c": "\\ud83d\\ude00"}', v) == ({"verdict": "approve", "c": "\U0001f600"}, [])


def test_validators_are_compiled_once_per_schema():
    assert compile_validator(dict(SCHEMA)) is compile_validator({**SCHEMA})


def test_check_schema():
    assert check_schema(SCHEMA) is None
    assert check_schema({"type": "objekt"}).startswith("invalid JSON Schema at type: ")
    # an error of the schema as a whole names no place in it
    assert check_schema({"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMaximum": True}) == \
        "invalid JSON Schema: 'maximum' is a dependency of 'exclusiveMaximum'"
    assert check_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}) == \
        "invalid JSON Schema: Pointer '/$defs/nope' does not exist"
    assert check_schema({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}) == \
        "$ref 'https://example.com/a.json' is not in this schema: only local references (#/$defs/...) resolve, nothing is fetched"
    # in a list of subschemas too, and a schema too deep for the checker's recursion
    assert check_schema({"anyOf": [{"type": "object"}, {"enum": []}]}) == \
        "invalid JSON Schema at anyOf/1/enum: an empty enum allows no value"
    assert check_schema({"allOf": [{"$ref": "https://x/a.json"}]}).startswith("$ref 'https://x/a.json' is not in this schema")
    deep = {"type": "object"}
    for _ in range(2000):
        deep = {"type": "object", "properties": {"a": deep}}
    assert check_schema(deep) == "invalid JSON Schema: nested too deeply"


def test_schema_json_sorts_keywords_but_keeps_the_order_of_properties():
    # constrained decoding writes properties in this order: sorted, the judge's reason came before its winner
    schema = {"type": "object", "required": ["winner"], "properties": {"winner": {"type": "string"}, "reason": {}},
              "patternProperties": {"^z": {}, "^a": {}}}
    assert schema_json(schema) == ('{"patternProperties":{"^z":{},"^a":{}},'
                                   '"properties":{"winner":{"type":"string"},"reason":{}},"required":["winner"],"type":"object"}')


def test_message_envelope_is_strict():
    m = Message(id="e:0", episode="e", turn=0, sender="a", recipients=["b"], content={}, raw="{}", valid=True)
    assert m.errors == [] and m.created > 0
    with pytest.raises(Exception):
        Message(id="e:0", episode="e", turn=0, sender="a", recipients=[], content={}, raw="", valid=True, extra=1)


def test_an_error_quoting_a_huge_value_is_cut_in_the_middle():
    # the retry prompt echoed a 1 MB reply's string whole (and the transcript kept it twice)
    v = compile_validator(SCHEMA)
    _, errors = parse_message('{"verdict": "' + "a" * 1_000_000 + '"}', v)
    assert len(errors) == 1 and len(errors[0]) < 500
    assert errors[0].startswith('at $.verdict: "aaa') and "(999" in errors[0]
    assert errors[0].endswith('aaa" is not one of "approve" or "request_changes"')
    whole = '{"verdict": "' + "a" * (MAX_ERROR_CHARS - len('at $.verdict: "" is not one of "approve" or "request_changes"')) + '"}'
    assert len(error := parse_message(whole, v)[1][0]) == MAX_ERROR_CHARS and "left out" not in error
