"""Schema-constrained decoding in the HF engine, on the tiny random model (it never writes JSON
on its own, so every valid reply below is the grammar's doing)."""
from __future__ import annotations

import asyncio
import copy
import json

import jsonschema
import pytest
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.grammar.book import ConstrainedRow, GrammarBook, book_for
from orchestrator.grammar.schema import GrammarError
from orchestrator.messages import schema_json
from orchestrator.models import load_model
from support import tiny_engine

VERDICT = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["approve", "request_changes"]},
                                            "comments": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
           "required": ["verdict"], "additionalProperties": False}
NESTED = {"type": "object", "properties": {
    "moves": {"type": "array", "minItems": 2, "maxItems": 3, "items": {
        "type": "object", "properties": {
            "piece": {"enum": ["king", "queen", "rook"]},
            "path": {"type": "array", "minItems": 1, "maxItems": 2,
                     "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 7}, "minItems": 2, "maxItems": 2}},
        }, "required": ["piece", "path"], "additionalProperties": False}},
    "ok": {"type": "boolean"},
}, "required": ["moves", "ok"], "additionalProperties": False}
NUMBER = {"type": "object", "properties": {"guess": {"type": "integer"}}, "required": ["guess"], "additionalProperties": False}
TEXT = {"type": "object", "properties": {"argument": {"type": "string", "minLength": 1, "maxLength": 400}},
        "required": ["argument"], "additionalProperties": False}
UNICODE = {"type": "object", "properties": {"mot": {"enum": ["café", "naïve", "日本語", "🙂 ok"]},
                                            "note": {"type": "string", "minLength": 2}},
           "required": ["mot", "note"], "additionalProperties": False}


@pytest.fixture(scope="module", params=[False, True], ids=["batch-kv", "static"])
def engine(request):
    e = tiny_engine(max_batch=16, max_prefill=16, static=request.param)
    yield e
    asyncio.run(e.aclose())


def request(engine, schema=None, prefix="", seed=0, max_tokens=48, temperature=1.0) -> GenerationRequest:
    prompt = engine.apply_chat_template([{"role": "user", "content": "Reply with one JSON object."}]) + engine.encode(prefix)
    return GenerationRequest(tuple(prompt), SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed),
                             json_schema=schema_json(schema) if schema else None, reply_prefix=prefix if schema else "")


def run(engine, reqs):
    async def go():
        return await asyncio.gather(*(engine.generate(r) for r in reqs))
    return asyncio.run(go())


def parsed(prefix: str, out) -> dict:
    value = json.loads(prefix + out.text)  # strict JSON: no raw control characters
    assert isinstance(value, dict)
    return value


def test_one_batch_mixes_grammars_and_free_rows(engine):
    schemas = [VERDICT, NESTED, NUMBER, None, TEXT, VERDICT, None]
    reqs = [request(engine, s, seed=i, max_tokens=64 if s is NESTED else 40) for i, s in enumerate(schemas)]  # NESTED needs 42
    together = run(engine, reqs)  # 7 rows, max_batch 16: admitted and decoded together
    for schema, out in zip(schemas, together):
        if schema is None:
            continue
        jsonschema.validate(parsed("", out), schema)
        assert out.finish_reason == "eos" and out.token_ids[-1] in engine.eos_ids
    # Each row samples as it would alone: masks do not leak between rows, nor onto free rows.
    for i in (0, 1, 3):
        r, out = reqs[i], together[i]
        (alone,) = run(engine, [r])
        assert alone.token_ids == out.token_ids
        assert alone.logprobs == pytest.approx(out.logprobs, abs=1e-4)


def test_enums_and_nested_arrays_are_always_valid(engine):
    outs = run(engine, [request(engine, NESTED, seed=s, max_tokens=100) for s in range(6)])
    for out in outs:
        value = parsed("", out)
        jsonschema.validate(value, NESTED)
        assert out.text == json.dumps(value)  # tight: json.dumps' own ", " and ": ", nothing else
    assert len({o.text for o in outs}) > 1  # the grammar constrains, it does not script


def test_reply_prefix_is_where_the_grammar_starts(engine):
    prefix = '{"verdict": "'
    outs = run(engine, [request(engine, VERDICT, prefix=prefix, seed=s) for s in range(6)])
    for out in outs:
        jsonschema.validate(parsed(prefix, out), VERDICT)
    with pytest.raises(GrammarError, match="reply_prefix"):
        run(engine, [request(engine, VERDICT, prefix='{"comments": 3')])


def test_running_out_of_tokens_closes_the_message_validly(engine):
    outs = run(engine, [request(engine, TEXT, seed=s, max_tokens=12) for s in range(6)])
    for out in outs:
        jsonschema.validate(parsed("", out), TEXT)
        assert len(out.token_ids) <= 12
    forced = [o for o in outs if o.forced_tokens]
    assert forced, "a random model writes until the budget: its replies must have been closed by force"
    for out in forced:
        assert out.logprobs[-out.forced_tokens:] == [0.0] * out.forced_tokens  # not sampled
        assert out.finish_reason == "eos" and out.token_ids[-1] in engine.eos_ids


def test_a_schema_that_cannot_fit_in_max_tokens_is_reported_truncated(engine):
    schema = {"type": "object", "properties": {"essay": {"type": "string", "minLength": 40}}, "required": ["essay"]}
    (out,) = run(engine, [request(engine, schema, max_tokens=6)])
    assert out.finish_reason == "length" and len(out.token_ids) == 6 and out.forced_tokens == 0
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_unicode_enums_strings_and_closings(engine):
    outs = run(engine, [request(engine, UNICODE, seed=s, max_tokens=24) for s in range(4)])
    for out in outs:
        jsonschema.validate(parsed("", out), UNICODE)
    # A closing from the middle of a multi-byte character finishes the character first.
    book = engine._grammars
    matcher = book.matcher(schema_json(UNICODE), '{"mot": "café", "note": "')
    assert matcher.accept_token(int(book._byte_ids[0xE6]))  # the first of the 3 bytes of a CJK character
    closing = book.closing(matcher)
    raw = '{"mot": "café", "note": "'.encode() + b"\xe6" + b"".join(book.info.decoded_vocab[t] for t in closing)
    jsonschema.validate(json.loads(raw.decode("utf-8")), UNICODE)


class Scripted:
    """A GrammarBook whose closings are scripted, one per search (None: none found)."""

    eos = 99

    def __init__(self, *closings):
        self.closings, self.asked = list(closings), 0

    def closing(self, matcher):
        self.asked += 1
        return self.closings.pop(0)


def planned(max_tokens: int, *closings, steps) -> ConstrainedRow:
    row = ConstrainedRow(Scripted(*closings), None, max_tokens)
    for produced in steps:
        row.plan(produced)
    return row


def test_the_budget_plan_case_by_case():
    """docs/constrained.md's length budgets, against scripted closings."""
    row = planned(2, [1, 2], steps=[0])  # the closing fits, the end of turn does not: close without it
    assert (row.forced, row.rollback, row.hopeless) == ([1, 2], False, False)
    row = planned(4, [1], None, steps=[0, 1])  # none found now, one a step ago: drop the last token, close before it
    assert (row.forced, row.rollback) == ([1, 99], True)
    row = planned(40, [1], [1] * 30, steps=range(17))  # a closing of 16 tokens ago is none: its state is gone
    assert (row.forced, row.rollback, row.hopeless) == ([], False, True)
    row = planned(4, None, steps=[0, 1, 2])  # nothing fits: sample on, and stop searching
    assert row.hopeless and row.forced == [] and row.book.asked == 1
    row = planned(3, [1, 2], steps=[0])  # closing + end of turn fit exactly: emit them now
    assert (row.forced, row.rollback) == ([1, 2, 99], False)
    # none found with room to spare: look again once the spare room is down to MARGIN, not past it
    row = planned(20, None, None, steps=range(5))
    assert row.book.asked == 2 and row.hopeless

    class Refusing:
        def accept_token(self, token):
            return False

    with pytest.raises(GrammarError, match="sampled token 7 is not allowed by the grammar"):
        ConstrainedRow(Scripted(), Refusing(), 4).accept(7)


@pytest.fixture(scope="module")
def book():
    tokenizer = load_model("tiny").tokenizer
    return book_for(tokenizer, len(tokenizer))


def test_a_token_that_leaves_no_room_is_taken_back_and_the_message_closed_before_it(book):
    """The rollback case on a real matcher: the grammar state goes back with the dropped token."""
    schema = schema_json({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "string"}}},
                          "required": ["a"], "additionalProperties": False})
    tok, matcher = book.tokenizer, book.matcher(schema, '{"a": "x')
    row = ConstrainedRow(book, matcher, 3)
    row.plan(0)  # "} and the end of turn fit, with one token to spare: sample
    (comma,) = tok.encode('",', add_special_tokens=False)
    row.accept(comma)  # now the message needs "b": [] and more: no room
    row.plan(1)
    drop, tokens = row.take_forced()
    assert drop == 1 and tokens[-1] == book.eos and matcher.is_terminated()
    assert json.loads('{"a": "x' + tok.decode(tokens[:-1])) == {"a": "x"}


def test_a_closing_the_tokenizer_spells_short_is_closed_byte_by_byte(book):
    """A tokenizer whose spelling of the closing the grammar takes but that leaves the message
    open (it dropped a character) would end the reply unclosed: the bytes are used instead."""
    tok = book.tokenizer

    class CutShort:
        def encode(self, text, **kwargs):
            return tok.encode(text[:-1], **kwargs)

    cut = GrammarBook(tok, book.vocab_size)
    cut.tokenizer = CutShort()
    closing = cut.closing(cut.matcher(schema_json(TEXT), '{"argument": "x'))
    assert b"".join(cut.info.decoded_vocab[t] for t in closing) == b'"}'


def test_a_forced_closing_ends_with_the_templates_end_of_turn(book):
    """Where EOS is another token (Gemma's <eos>), a closing ends as the chat template ends a
    reply, so a later turn can continue it."""
    tok = copy.deepcopy(book.tokenizer)
    tok.eos_token = "<|endoftext|>"
    assert tok.eos_token_id != book.eos
    assert GrammarBook(tok, book.vocab_size).eos == book.eos == tok.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.parametrize("schema, prefix, closing", [
    # inside a number, more keys to come: the walk took digits forever and found none
    ({"type": "object", "properties": {k: {"type": "number"} for k in ("acc", "flu", "rel")}, "required": ["acc", "flu", "rel"]},
     '{"acc": 1', ', "flu": 0, "rel": 0}'),
    # ... and "key11" after "key1" leaves the mask as it was: no sign of a loop
    ({"type": "object", "properties": {f"key{i:02d}": {"type": "integer"} for i in range(12)},
      "required": [f"key{i:02d}" for i in range(12)]}, '{"key00": 12', "".join(f', "key{i:02d}": 0' for i in range(1, 12)) + "}"),
    # an object with no required key, and an array, close empty: the shortest
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, "", "{}"),
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "array", "items": {"type": "integer"}},
                                                        {"type": "object", "properties": {"q": {"type": "boolean"}}, "required": ["q"]}]}},
      "required": ["a"]}, '{"a": ', "[]}"),
    # a string that may not end yet is filled with letters, not the brackets it may also hold
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 3}}, "required": ["a"]}, '{"a": "', 'aaa"}'),
    # the greedy walk loops on a pattern (.+ takes every letter): the search over parser states
    # finds the way out, which a search over masks alone (the same after a and after a.) missed
    ({"type": "object", "properties": {"path": {"type": "string", "pattern": "^tests/.+\\.py$"}}, "required": ["path"]},
     '{"path": "tests/a', '.py"}'),
])
def test_closings_are_found_and_short(engine, schema, prefix, closing):
    """Budgets ran out on replies whose closing the search did not find (7 of 16 invalid with a
    number key before another), or found long ({"a": 0} for {})."""
    book = engine._grammars
    tokens = book.closing(book.matcher(schema_json(schema), prefix))
    assert tokens is not None and b"".join(book.info.decoded_vocab[t] for t in tokens).decode() == closing
    jsonschema.validate(json.loads(prefix + closing), schema)
