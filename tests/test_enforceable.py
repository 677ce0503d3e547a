"""What constrained decoding cannot hold a reply to is refused when a schema is checked (role load,
`rolecast validate`, serve's response_format), naming where and what: xgrammar left these out or
compiled them wrongly, and every constrained reply could break them (found by a user's hunt)."""
from __future__ import annotations

import json

import pytest

from orchestrator.grammar.enforceable import check_enforceable
from orchestrator.grammar.errors import GrammarError
from orchestrator.grammar.schema import check_reply_prefix
from orchestrator.messages import check_schema


def obj(**properties) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties)}


@pytest.mark.parametrize("schema, words", [
    (obj(xs={"type": "array", "items": {"type": "integer"}, "uniqueItems": True}), "properties.xs: constrained decoding cannot enforce 'uniqueItems'"),
    (obj(a={"not": {"type": "string"}}), "properties.a: constrained decoding cannot enforce 'not'"),
    (obj(a={"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}), "'if'"),
    ({**obj(a={"type": "string"}), "dependentRequired": {"a": ["b"]}}, "the schema: constrained decoding cannot enforce 'dependentRequired'"),
    # draft-07's spelling of it, which the validator enforced (a reply {"a": 1} without "b" refused)
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependencies": {"a": ["b"]}}, "the schema: constrained decoding cannot enforce 'dependencies'"),
    (obj(xs={"type": "array", "contains": {"const": 1}}), "'contains'"),
    (obj(a={"allOf": [{"type": "integer"}, {"minimum": 2}]}), "allOf with one branch only"),
    (obj(a={"type": "number", "multipleOf": 0.5}), "multipleOf only as a whole number on an integer"),
    (obj(a={"type": "integer", "multipleOf": 3, "minimum": 2}), "properties.a: constrained decoding drops multipleOf beside minimum"),
    (obj(a={"type": "integer", "exclusiveMaximum": 50, "multipleOf": 5}), "drops multipleOf beside exclusiveMaximum"),
    (obj(a={"type": "string", "pattern": "^[a-z]+$", "maxLength": 9}), "drops maxLength beside pattern"),
    (obj(a={"type": "string", "format": "date", "minLength": 3}), "drops minLength beside format"),
    (obj(a={"type": "string", "pattern": '^say "[a-z]+"$'}), "literal quote or backslash"),
    (obj(a={"type": "string", "pattern": r"^C:\\[a-z]+$"}), "literal quote or backslash"),
    (obj(a={"type": "string", "pattern": r"^\u0022[a-z]+$"}), "literal quote or backslash"),  # written raw: ""ab"
    (obj(a={"type": "string", "pattern": r"^a\x5Cb$"}), "literal quote or backslash"),
    (obj(a={"type": "string", "pattern": "^[a-z ]{1,200}$"}), "repeats more than 128 times"),
    (obj(a={"type": "string", "pattern": r"^(?=.*\.py$)[a-z_./]{1,20}$"}), "properties.a: constrained decoding cannot enforce the lookahead"),
    (obj(a={"type": "string", "pattern": "^(?!x).+$"}), "cannot enforce the lookahead"),
    (obj(a={"type": "string", "minLength": 20000}), "minLength 20000 without a maxLength takes minutes"),
    (obj(a={"type": "string", "minLength": 101}), "minLength 101 without a maxLength"),  # the first past MAX_MIN_LENGTH
    (obj(a={"type": "object", "propertyNames": {"not": {"const": "x"}}}), "properties.a.propertyNames: constrained decoding cannot enforce 'not'"),
    ({"type": "object", "patternProperties": {"^x": {"type": "array", "uniqueItems": True}}}, "patternProperties.^x: constrained decoding cannot enforce 'uniqueItems'"),
    (obj(a={"type": "number", "multipleOf": 2}), "multipleOf only as a whole number on an integer"),  # a whole step, on a number
    (obj(a={"type": "integer", "multipleOf": 2.5}), "multipleOf only as a whole number on an integer"),  # on an integer, a fraction
    ({"$schema": "http://json-schema.org/draft-07/schema#", **obj(a={"type": "array", "items": [{"type": "integer"}], "additionalItems": {"uniqueItems": True}})},
     "properties.a.additionalItems: constrained decoding cannot enforce 'uniqueItems'"),
    ({**obj(a={"$ref": "#/definitions/n"}), "definitions": {"n": {"type": "array", "uniqueItems": True}}}, "definitions.n: constrained decoding cannot enforce 'uniqueItems'"),
    (obj(a={"type": "array", "prefixItems": [{"type": "array", "uniqueItems": True}]}), "properties.a.prefixItems[0]: constrained decoding cannot enforce 'uniqueItems'"),
    ({**obj(a={"$ref": "#/$defs/n", "minimum": 3}), "$defs": {"n": {"type": "integer"}}}, "ignores minimum beside $ref"),
    ({**obj(a={"$ref": "#/$defs/n"}), "$defs": {"n": {"type": "array", "items": {"uniqueItems": True}}}},
     "$defs.n.items: constrained decoding cannot enforce 'uniqueItems'"),
    (obj(a={"anyOf": [{"type": "null"}, {"type": "array", "uniqueItems": True}]}), "properties.a.anyOf[1]"),
    (obj(a={"type": "integer", "enum": [1, 2, "x"]}), "properties.a: constrained decoding writes every enum value, and 'x' breaks"),
    (obj(a={"const": "abc", "maxLength": 2}), "writes every const value, and 'abc' breaks the keywords beside it"),
    (obj(a={"enum": ["x", {"n": [10**30]}]}), "properties.a: constrained decoding writes the integer " + str(10**30) + " as 1e+30"),
    (obj(a={"const": 2**63 + 1}), "keep enum and const integers within 64 bits"),
    (obj(a={"type": "integer", "minimum": 1.5}), "properties.a: constrained decoding takes an integer's minimum only as a whole number"),
    (obj(a={"type": ["integer", "null"], "maximum": 2**63}), "integer's maximum only as a whole number within 64 bits, not 9223372036854775808"),
    (obj(a={"type": "string", "format": "email"}), "properties.a: constrained decoding writes format 'email' as invalid JSON"),
    (obj(a={"type": "string", "format": "json-pointer"}), "format 'json-pointer' as invalid JSON"),
    # draft-07's validator checks the format, by rules xgrammar's pattern does not keep: 2024-02-30 was written and refused
    ({"$schema": "http://json-schema.org/draft-07/schema#", **obj(d={"type": "string", "format": "date"})},
     "properties.d: constrained decoding writes format 'date' by looser rules than the validator of http://json-schema.org/draft-07/schema#"),
    ({**obj(a={"type": "integer"}), "required": ["a", "b"]}, "the schema: required 'b' is not in properties"),
    (obj(a={"type": "object", "required": ["k"]}), "properties.a: required 'k' is not in properties"),
    (obj(a={"type": "integer", "anyOf": [{"minimum": 5}, {"maximum": -5}]}), "properties.a: constrained decoding ignores type beside anyOf"),
    ({**obj(k={"type": "integer"}), "oneOf": [obj(k={"const": 1}), obj(k={"const": 2})]}, "the schema: constrained decoding ignores properties, required, type beside oneOf"),
    # xgrammar wrote these as anyOf: 1, or {"a": 1}, matched both branches, and oneOf refused every such reply
    (obj(v={"oneOf": [{"type": "integer"}, {"type": "number"}]}), "properties.v: constrained decoding enforces oneOf as anyOf, and oneOf[0] and oneOf[1] may both match"),
    (obj(v={"oneOf": [{"type": "string"}, obj(a={"type": "integer"}), {"type": "object", "properties": {"b": {"type": "integer"}}}]}), "oneOf[1] and oneOf[2] may both match"),
    (obj(v={"oneOf": [{"enum": ["a", 1]}, {"const": 1.0}]}), "oneOf[0] and oneOf[1] may both match"),
    ({**obj(a={"$ref": "#/$defs/d"}), "$defs": {"d": {"$ref": "#/$defs/d"}}}, "the schema allows no message: a $ref cycle"),
    ({**obj(a={"$ref": "#/$defs/n"}), "$defs": {"n": obj(v={"type": "integer"}, next={"$ref": "#/$defs/n"})}}, "make the recursion optional"),
    # xgrammar counts keys, not distinct ones: {"x": 1, "x": 2} was written for minProperties 2, and refused
    (obj(a={"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}),
     "properties.a: constrained decoding may write a free key twice (JSON keeps one), so it cannot enforce minProperties 2 with 0 required"),
    ({**obj(k={"type": "string"}), "patternProperties": {"^x": {"type": "integer"}}, "minProperties": 3},
     "enforce minProperties 3 with 1 required: require more properties, or lower minProperties to 2"),
])
def test_what_decoding_would_not_enforce_is_refused_where_it_is(schema, words):
    assert check_schema(schema) is None  # valid JSON Schema all: only the decoding cannot hold them
    with pytest.raises(GrammarError) as caught:
        check_reply_prefix(json.dumps(schema), "")
    assert words in str(caught.value)


@pytest.mark.parametrize("schema", [
    obj(xs={"type": "array", "items": {"type": "integer"}, "uniqueItems": False}),
    obj(n={"type": "integer", "minimum": -2**63, "maximum": 2.0**62}, m={"type": "integer", "multipleOf": 3}),
    obj(a={"type": "string", "pattern": r"^tests/.+\.py$"}, b={"type": "string", "pattern": "^f\\([^{}]{1,58}$"}),
    obj(a={"type": "string", "minLength": 1, "maxLength": 1200}, b={"type": "string", "minLength": 100}),
    {**obj(a={"$ref": "#/$defs/n", "description": "a count"}), "$defs": {"n": {"type": "integer"}}},
    {"$schema": "https://json-schema.org/draft/2020-12/schema", **obj(d={"type": "string", "format": "date"})},  # a note
    obj(a={"allOf": [{"type": "integer"}]}),
    # one free key beyond the required ones: written twice, it still counts once more
    {**obj(k={"type": "string"}), "additionalProperties": {"type": "integer"}, "minProperties": 2},
    {"type": "object", "properties": {"k": {"type": "string"}, "j": {"type": "string"}}, "minProperties": 2},  # no free keys
    obj(a={"enum": [2**64, -2**63, 9007199254740993]}),  # written exactly (a double, an int64)
    {**obj(a={"type": "string", "enum": ["ab", "cd"], "maxLength": 2}, b={"const": [1], "type": "array", "items": {"$ref": "#/$defs/n"}}),
     "$defs": {"n": {"type": "integer"}}},
    obj(v={"oneOf": [{"type": ["string", "null"]}, {"type": "integer", "maximum": 3}, {"enum": [True, [1]]}]}),
    obj(v={"oneOf": [obj(kind={"const": "a"}, n={"type": "integer"}), obj(kind={"enum": ["b", "c"]}, n={"type": "number"})]}),
    obj(v={"oneOf": [{"enum": [[True], "x"]}, {"enum": [[1], "y"]}]}),  # true is not 1 in JSON
    {**obj(v={"oneOf": [{"$ref": "#/$defs/a~1b"}, {"type": "string"}]}), "$defs": {"a/b": {"type": "integer"}}},  # ~1 is a /
    {**obj(v={"oneOf": [{"$ref": "#/$defs/a~0b"}, {"type": "string"}]}), "$defs": {"a~b": {"type": "integer"}}},  # ~0 is a ~
    obj(v={"oneOf": [{"const": {"a": 1}}, {"const": {"a": 1, "b": 2}}]}),  # a key more is another value
    obj(v={"oneOf": [{"const": [1]}, {"const": [1, 2]}]}),  # ... and so is an item more
    # a root $ref beside its $defs: pydantic's schema of a recursive model
    {"$ref": "#/$defs/node", "$defs": {"node": obj(v={"type": "integer"}, next={"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]})}},
    # ... and a tagged union beside its (OpenAPI) discriminator
    {**obj(pet={"oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}], "discriminator": {"propertyName": "kind"}}),
     "$defs": {"cat": obj(kind={"const": "cat"}, meows={"type": "integer"}), "dog": obj(kind={"const": "dog"})}},
])
def test_what_decoding_enforces_passes(schema):
    check_enforceable(schema)
    check_reply_prefix(json.dumps(schema), "")


def test_a_remote_ref_is_refused_whatever_the_decoding():
    """The validator would fetch it at run time (every episode failed, after a network wait), and
    the grammar took it as any value."""
    schema = obj(a={"$ref": "http://example.com/x.json"})
    assert "$ref 'http://example.com/x.json' is not in this schema" in check_schema(schema)
    assert check_schema({**obj(a={"$ref": "#/$defs/n"}), "$defs": {"n": {"type": "integer"}}}) is None


def test_a_compile_failure_only_the_real_vocabulary_shows_is_a_grammar_error(monkeypatch):
    """xgrammar's RuntimeError from compiling against a tokenizer's vocabulary was a 500 in serve
    and a failed episode in a run; it is the same GrammarError (400, one line) as a schema refused."""
    from orchestrator.grammar.book import GrammarBook
    from orchestrator.models import load_model

    tokenizer = load_model("tiny", dtype="float32").tokenizer
    book = GrammarBook(tokenizer, len(tokenizer))

    def fails(grammar):
        raise RuntimeError("[12:00:00] grammar_functor.cc:3567: Check failed: per_rule_fsm_hashes")

    monkeypatch.setattr(book, "_compiler", type("Compiler", (), {"compile_grammar": staticmethod(fails)})())
    with pytest.raises(GrammarError, match="^xgrammar cannot compile this schema: Check failed: per_rule_fsm_hashes$"):
        book.compiled(json.dumps(obj(a={"type": "string"})))


@pytest.mark.parametrize("raised, said", [
    ("[12:00:00] grammar_functor.cc:3567: Check failed: x", "xgrammar cannot compile this schema: Check failed: x"),
    # xgrammar 0.2.9 writes no time, and refuses a $ref cycle itself, where 0.2.8 left it to derives_nothing
    ("/project/cpp/json_schema_converter.cc:3562: Circular $ref chain with no schema content: #/$defs/d -> #/$defs/d\n",
     "the schema allows no message: a $ref cycle has no way out"),
])
def test_xgrammars_refusal_is_one_line_whatever_its_version_writes(raised, said):
    from orchestrator.grammar.errors import compile_error

    assert str(compile_error(RuntimeError(raised))).startswith(said) and ".cc:" not in str(compile_error(RuntimeError(raised)))


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2}])
def test_strings_hold_no_utf8_encoded_surrogates(schema):
    """\\xed\\xa0\\x80 (U+D800) passed xgrammar's string classes: not UTF-8, it decoded to three
    replacement characters, past a maxLength (random walks wrote it in free strings)."""
    import xgrammar

    from orchestrator.grammar.schema import grammar_after, tight_grammar

    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), max_threads=1)
    for grammar, text in [(tight_grammar(json.dumps(schema)), '"ab'), (xgrammar.Grammar.from_ebnf(grammar_after(json.dumps(schema), '"a')), "b")]:
        matcher = xgrammar.GrammarMatcher(compiler.compile_grammar(grammar), terminate_without_stop_token=True)
        assert matcher.accept_string(text.encode())  # the grammar of the rest (vLLM's) excludes them too
        assert not matcher.accept_string(b"\xed\xa0\x80")
        assert matcher.accept_string('é"'.encode()) and matcher.is_terminated()


@pytest.mark.parametrize("schema", [{"type": "number"}, {"type": "array", "items": {}},
                                    {"type": "array", "items": {"$ref": "#/$defs/n"}, "$defs": {"n": {"type": "number"}}}])
def test_numbers_stay_finite_floats(schema):
    """``1e999`` (or 400 digits and a fraction) is a JSON number Python reads as inf, which the
    validator took for null: a constrained reply "not of type number" (random walks wrote 3e01582260254946)."""
    import xgrammar

    from orchestrator.grammar.schema import tight_grammar

    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), max_threads=1)
    grammar = compiler.compile_grammar(tight_grammar(json.dumps(schema)))
    start = "[" if schema["type"] == "array" else ""
    for text, ok in [("1e999", False), ("-1E+100", False), ("1" * 201, False), ("-2.5e-07", True), ("9" * 200 + ".5E99", True)]:
        matcher = xgrammar.GrammarMatcher(grammar, terminate_without_stop_token=True)
        assert matcher.accept_string(start + text) == ok, text


@pytest.mark.parametrize("schema, texts", [
    ({"type": "string"}, [r'"\udc00"', r'"\ud83d\ude00"', r'"\ud83dx"', r'"\uD7FF\uE000"', r'"\ud83d\udbff"']),
    ({"type": "string", "minLength": 2}, [r'"\ud83d\ude00"', r'"\ud83d\ude00x"', r'"\u00e9\u00e9"']),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, [r'{"\udfff": 1}', r'{"\uDBFF\uDFFF": 1}']),
])
def test_unicode_escapes_are_whole_characters(schema, texts):
    """The grammar took a lone surrogate escape (``\\udc00``), which parse_message refuses, and a pair
    (``\\ud83d\\ude00``, one character) as two characters of a minLength: replies it refused."""
    import xgrammar

    from orchestrator.grammar.schema import grammar_after, tight_grammar
    from orchestrator.messages import compile_validator, parse_message

    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), max_threads=1)
    whole = obj(a=schema)
    grammars = [(tight_grammar(json.dumps(whole)), '{"a": '), (xgrammar.Grammar.from_ebnf(grammar_after(json.dumps(whole), '{"a')), '": ')]
    for text in texts:
        valid = parse_message('{"a": ' + text + "}", compile_validator(whole))[1] == []
        for grammar, start in grammars:  # the vLLM grammar of the rest too
            matcher = xgrammar.GrammarMatcher(compiler.compile_grammar(grammar), terminate_without_stop_token=True)
            assert (matcher.accept_string(start + text + "}") and matcher.is_terminated()) == valid, text


def _patterned(pattern: str) -> dict:
    return {"type": "string", "pattern": pattern}


@pytest.mark.parametrize("schema, values", [
    (_patterned(r"^\S+$"), ["a\u00a0b", "a\u3000b", "a\ufeffb", "a\u2028b", "a\u2003b", "ab"]),
    (_patterned(r"^[^\s]+$"), ["a\u1680b", "a\u2029b", "a\u202fb", "ab"]),
    (_patterned(r"^[\S,]+$"), ["a\u205f", "a,b"]),
    (_patterned(r"^[\S ]+$"), ["a b", "a\u205f"]),  # \S beside a space in a class: the space still allowed
    (_patterned(r"^[\]|a]$"), ["]", "|", "a", "]x", "xa"]),  # an escaped ] does not end a class, whose | is a character
    (_patterned(r"^a.b$"), ["a\u2028b", "a\u2029b", "a\u00a0b", "axb"]),
    (_patterned(r"^\.[.]$"), ["..", "x.", ".x"]),  # an escaped dot, and one in a class, stay dots
    # ECMA-262's \x takes two hex digits: xgrammar read \x41b as U+041B, and every reply broke the pattern
    (_patterned(r"^\x41b$"), ["Ab", "\u041b"]),
    (_patterned(r"^[\x41-\x43]d$"), ["Bd", "Dd", "Ad"]),
    ({"type": "object", "patternProperties": {r"^\S+$": {"type": "integer"}}, "additionalProperties": False},
     [{"a\u00a0b": 1}, {"ab": 1}]),
    ({"type": "object", "propertyNames": {"pattern": r"^\S+$"}}, [{"a\u3000b": 1}, {"ab": 1}]),
    # the validator searches: an unanchored side takes any text (xgrammar matched "^tests/" only as "tests/")
    (_patterned("^tests/"), ["tests/a.py", "tests/", "src/tests/"]),
    (_patterned("[0-9]"), ["a1b", "7", "ab"]),
    (_patterned("^a|b$"), ["ax", "xb", "xa", "bx"]),
    (_patterned("(^a|b)"), ["a", "b", "za"]),  # an anchor in a group: matched whole, as before (never more than the validator)
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
     [{"x1": 1}, {"yx": 1}]),
])
def test_patterns_allow_no_more_than_the_validator(schema, values):
    """The validator reads patterns as ECMA-262: its \\s holds Unicode spaces (\\u00a0, \\u3000,
    \\ufeff...) and its . stops at \\u2028 and \\u2029; xgrammar's \\S, [^\\s] and . took them, so the
    grammar let replies write what the validator refused (found by fuzzing). And it searches, where
    xgrammar matched a pattern whole: the grammar allowed less than the validator."""
    import xgrammar

    from orchestrator.grammar.schema import grammar_after, tight_grammar
    from orchestrator.messages import compile_validator, parse_message

    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), max_threads=1)
    whole = obj(a=schema)
    grammars = [(tight_grammar(json.dumps(whole)), '{"a": '), (xgrammar.Grammar.from_ebnf(grammar_after(json.dumps(whole), '{"a')), '": ')]
    for value in values:
        for text in (json.dumps(value, ensure_ascii=False), json.dumps(value)):  # raw, and as \u escapes
            valid = parse_message('{"a": ' + text + "}", compile_validator(whole))[1] == []
            for grammar, start in grammars:  # the vLLM grammar of the rest too
                matcher = xgrammar.GrammarMatcher(compiler.compile_grammar(grammar), terminate_without_stop_token=True)
                taken = matcher.accept_string((start + text + "}").encode()) and matcher.is_terminated()
                assert taken == valid if "\\u" not in text else taken <= valid, text  # a pattern's escapes: stricter
