"""The grammar of what follows a reply prefix (grammar/ebnf.py) allows exactly what the schema's
grammar allows after that prefix, checked with xgrammar's own matcher on every library role."""
from __future__ import annotations

import json
import random

import pytest
from orchestrator.grammar.ebnf import EbnfError, parse, quotient
from orchestrator.grammar.book import book_for
from orchestrator.grammar.schema import tight_grammar
from orchestrator.models import load_model
from orchestrator.role import LIBRARY_DIR, library_roles, load_role

xgr = pytest.importorskip("xgrammar")
COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1)
ALPHABET = list('{}[]":, abcdefghijklmnopqrstuvwxyzT0123456789-+.eE\\/_\n\t\x01') + ["é"]


def matcher(grammar):
    return xgr.GrammarMatcher(COMPILER.compile_grammar(grammar), terminate_without_stop_token=True)


def verdict(grammar, text: str) -> tuple[bool, bool]:
    m = matcher(grammar)
    return m.accept_string(text), m.is_terminated()


def walks(grammar, prefix: str, rng: random.Random, count: int = 12, length: int = 200) -> list[str]:
    """Random continuations the full grammar allows after ``prefix``: every step of each walk."""
    out = []
    for _ in range(count):
        text, m = "", matcher(grammar)
        assert m.accept_string(prefix)
        for _ in range(length):
            allowed = [c for c in ALPHABET if m.fork().accept_string(c)]
            if not allowed:
                break
            closing = [c for c in allowed if c in '"}]']
            c = rng.choice(closing if closing and rng.random() < 0.5 else allowed)
            m.accept_string(c)
            text += c
            out.append(text)
    return out


def mutated(texts: list[str], rng: random.Random) -> list[str]:
    """Each text with one character changed: mostly across the grammar's border."""
    out = []
    for text in texts:
        i = rng.randrange(len(text))
        out.append(text[:i] + rng.choice(ALPHABET) + text[i + 1:])
    return out


@pytest.fixture(scope="module")
def book():
    tokenizer = load_model("tiny").tokenizer
    return book_for(tokenizer, len(tokenizer))


def finished(book, schema: str, prefix: str, text: str) -> str:
    """``text`` and the engine's shortest closing after it: a whole message."""
    m = book.matcher(schema, prefix)
    assert m.accept_string(text)
    closing = book.closing(m)
    assert closing is not None
    return text + book.tokenizer.decode(closing)


@pytest.mark.parametrize("name", library_roles())
def test_the_rest_after_each_library_prefix_is_what_the_schema_allows(name, book):
    role = load_role(LIBRARY_DIR / f"{name}.yaml")
    prefix = role.config.reply_prefix
    full = tight_grammar(role.json_schema)
    rest = xgr.Grammar.from_ebnf(quotient(str(full), prefix))
    texts = walks(full, prefix, random.Random(name))
    assert len(texts) > 12  # the walks went somewhere
    whole = [finished(book, role.json_schema, prefix, t) for t in ("", texts[0], texts[len(texts) // 2])]
    for text in whole:
        assert verdict(full, prefix + text) == (True, True), text
    for text in texts + mutated(texts, random.Random(name)) + whole:
        assert verdict(rest, text) == verdict(full, prefix + text), text


@pytest.mark.parametrize("prefix", ["", "{", '{"edits": [{"path": "src/a.py", "search": "x\\n', '{"edits": [{"path": "a", "search": "", "replace": ""}'])
def test_prefixes_that_end_anywhere(prefix):
    schema = load_role(LIBRARY_DIR / "coder.yaml").json_schema
    full = tight_grammar(schema)
    rest = xgr.Grammar.from_ebnf(quotient(str(full), prefix))
    texts = walks(full, prefix, random.Random(prefix), count=6)
    for text in texts + mutated(texts, random.Random(prefix)):
        assert verdict(rest, text) == verdict(full, prefix + text), text


def test_a_prefix_the_grammar_refuses_is_an_error():
    full = str(tight_grammar('{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'))
    with pytest.raises(EbnfError, match="no message that starts with"):
        quotient(full, '{"b"')


def test_recursive_rules_and_repetitions():
    grammar = 'root ::= "(" root ")" | [a-c]{2, 3} tail\ntail ::= "x"* (=(")"))\n'
    assert set(parse(grammar)) == {"root", "tail"}
    rest = xgr.Grammar.from_ebnf(quotient(grammar, "((a"))
    for text, expected in [("b))", (True, True)), ("bcxx))", (True, True)), ("bcdx", (False, False)), ("))", (False, False))]:
        assert verdict(rest, text) == expected == verdict(xgr.Grammar.from_ebnf(grammar), "((a" + text), text
    short = 'root ::= "a"? "b"+ "c"{2} "d"\n'  # the short forms xgrammar parses (and never prints)
    rest = xgr.Grammar.from_ebnf(quotient(short, "a"))
    for text, expected in [("bccd", True), ("bbccd", True), ("abccd", False), ("ccd", False), ("bcd", False), ("bcccd", False)]:
        assert verdict(rest, text)[0] == expected == verdict(xgr.Grammar.from_ebnf(short), "a" + text)[0], text


def test_one_book_per_tokenizer_and_vocabulary_size(book):
    """A model whose embedding is padded past its tokenizer (vocab_size above len) needs masks that wide."""
    assert book_for(book.tokenizer, book.vocab_size) is book
    wider = book_for(book.tokenizer, book.vocab_size + 64)
    assert wider is not book and wider.width == book.width + 2


def test_a_dead_rule_under_a_star_and_a_class_ending_in_a_dash():
    """A repetition of a rule that derives nothing still matches zero times, and ``[a-]`` holds a
    dash (no range to ``]``)."""
    grammar = 'root ::= [a-] b* "c"\nb ::= b "x"\n'
    rest = xgr.Grammar.from_ebnf(quotient(grammar, "-"))
    assert [verdict(rest, text) for text in ("c", "xc", "-c")] == [(True, True), (False, False), (False, False)]


def test_a_book_keeps_the_grammars_of_the_schemas_last_used(book, monkeypatch):
    """`rolecast serve` compiles each schema a client sends: the book (and xgrammar's own cache
    beside it) kept every one for the process's life."""
    import orchestrator.grammar.book as book_module

    monkeypatch.setattr(book_module, "MAX_SCHEMAS", 2)
    small = book_module.GrammarBook(book.tokenizer, book.vocab_size)
    a, b, c = (f'{{"type": "object", "properties": {{"{k}": {{"enum": [1, 2]}}}}, "required": ["{k}"]}}' for k in "abc")
    first = small.compiled(a)
    small.compiled(b), small.compiled(a), small.compiled(c)  # b is the least recently used
    assert small._compiled.get(b) is None and small._compiled.get(c) is not None  # the newest stays
    assert small.compiled(a) is first and len(small._compiled) == 2 and small._compiler.get_cache_size_bytes() == 0
    for schema in (a, b, c):
        assert small.spellings(schema) is not None
    assert len(small._spellings) == 2


BOUNDED = {"type": "object", "properties": {
    "a": {"type": "string", "maxLength": 4}, "b": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
    "c": {"type": "string", "pattern": "^ab?c{2}[x-z]{1,3}$"}, "d": {"type": "number"}, "e": {"type": "string", "minLength": 3},
}, "required": ["a", "b", "c", "d", "e"]}
AFTER_B = '{"a": "", "b": [0, 1], "c": "'
# patterns sit in a JSON string: the rest keeps out the quotes, backslashes and control characters their classes and literals hold
PATTERNS = {"type": "object", "properties": {
    "p": {"type": "string", "pattern": "^[ -~]{1,5}$"}, "q": {"type": "string", "pattern": "^a(b?){2}c$"},
    "r": {"type": "string", "pattern": "^a(\\n|b)c$"}, "s": {"enum": ["\U0001f642 ok", "\U0001f642!"]},
}, "required": ["p", "q", "r", "s"]}


@pytest.mark.parametrize("schema, prefix, probes", [
    (BOUNDED, '{"a": "xy', ['"', 'z"', 'zw"', 'zwv"']),  # two of a maxLength's four characters left
    (BOUNDED, '{"a": "wxyz', ['"', 'a"']),  # ... and none
    (BOUNDED, '{"a": "", "b": [7', [']', ', 1]', ', 1, 2]', ', 1, 2, 3]']),  # an item short of minItems, two of maxItems
    (BOUNDED, AFTER_B + "a", ['ccx"', 'bccx"', 'bbccx"', 'cx"', 'ccxyz"', 'ccxyzx"', 'bcc"']),  # ?, {2}, {1,3} in a pattern
    (BOUNDED, AFTER_B + "abc", ['cx"', 'x"', 'cxx"']),
    (BOUNDED, AFTER_B + 'accx", "d": -1.5e', ['1, ', '12, ', '123, ', '+1, ', '-, ']),  # the exponent's {1, 2} digits
    (BOUNDED, AFTER_B + 'accx", "d": 0, "e": "x', ['yz"}', 'y"}', '\\n\\"y"}', 'y\\u00e9"}']),  # a minLength's first characters
    (PATTERNS, '{"p": "a', ['"', '""', '\\"', '!#"', 'bcde"', 'bcdef"']),
    (PATTERNS, '{"p": "a", "q": "a', ['c"', 'bc"', 'bbc"', 'bbbc"']),  # (b?){2} can be empty
    (PATTERNS, '{"p": "a", "q": "ac", "r": "a', ['bc"', '\nc"', '\\nc"']),  # a raw newline is no JSON
    (PATTERNS, '{"p": "a", "q": "ac", "r": "abc", "s": "\U0001f642', [' ok"}', '!"}', ' o"}']),  # a \U escape in the grammar
])
def test_prefixes_inside_repetitions(schema, prefix, probes):
    """The rest after a prefix that ends inside a bounded repetition (a maxLength, minItems /
    maxItems, a pattern's ?, {n} and {m,n}, a number's exponent, a minLength) counts what the
    prefix already used: the library roles' prefixes end before any repetition."""
    full = tight_grammar(json.dumps(schema))
    rest = xgr.Grammar.from_ebnf(quotient(str(full), prefix))
    texts = walks(full, prefix, random.Random(prefix), count=6)
    for text in probes + texts + mutated(texts, random.Random(prefix)):
        assert verdict(rest, text) == verdict(full, prefix + text), text
