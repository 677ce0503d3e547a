"""The grammar of what follows a reply prefix (grammar/ebnf.py) allows exactly what the schema's
grammar allows after that prefix, checked with xgrammar's own matcher on every library role."""
from __future__ import annotations

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


def test_a_book_keeps_the_grammars_of_the_schemas_last_used(book, monkeypatch):
    """`rolecast serve` compiles each schema a client sends: the book (and xgrammar's own cache
    beside it) kept every one for the process's life."""
    import orchestrator.grammar.book as book_module

    monkeypatch.setattr(book_module, "MAX_SCHEMAS", 2)
    small = book_module.GrammarBook(book.tokenizer, book.vocab_size)
    a, b, c = (f'{{"type": "object", "properties": {{"{k}": {{"enum": [1, 2]}}}}, "required": ["{k}"]}}' for k in "abc")
    first = small.compiled(a)
    small.compiled(b), small.compiled(a), small.compiled(c)  # b is the least recently used
    assert small.compiled(a) is first and len(small._compiled) == 2 and small._compiler.get_cache_size_bytes() == 0
    for schema in (a, b, c):
        assert small.spellings(schema) is not None
    assert len(small._spellings) == 2
