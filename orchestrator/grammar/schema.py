"""A role's JSON schema as a grammar: tight JSON (``", "`` and ``": "``, no free whitespace,
properties in declared order), the check that a reply prefix starts a message it allows, and the
grammar of what follows a prefix (for backends that take a grammar, not a matcher: vLLM).
Needs no torch: roles are checked with it when a team loads."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from .ebnf import EbnfError, derives_nothing, quotient
from .enforceable import subschemas, check_enforceable
from .errors import CYCLE, GrammarError, compile_error


def xgrammar():
    """The xgrammar module, imported on first use (it takes a second or two)."""
    import xgrammar

    return xgrammar


# xgrammar 0.2 spells a string with minLength / maxLength as <"> [^"\\\r\n]{m,n} <">: no
# escapes, yet raw control characters (invalid JSON). The characters lose the control range;
# a string with only a minLength becomes m JSON characters (an escape counts as one) and then
# the ordinary JSON string tail, so it may hold newlines and quotes. Bounded strings stay
# escape-free: an escape alternative inside {m,n} makes every mask fill scan the vocabulary
# (0.03 ms -> 60-250 ms per token, measured).
_LENGTH_CHARS = re.compile(r'^(\w+_characters) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.M)
_MIN_ONLY = re.compile(r'^(\w+) ::= \(\("\\"" \w+_characters\{(\d+), -1\} "\\""\)\)$', re.M)
_JSON_CHAR = r'([^\0-\x1f\"\\] | ("\\" basic_escape))'
_HEX = "[A-Fa-f0-9]"
_HEX_ESCAPE = f'("u" {_HEX} {_HEX} {_HEX} {_HEX})'
_UNICODE_ESCAPE = (f'("u" [0-9A-CEFa-cef] {_HEX} {_HEX} {_HEX}) | ("u" [Dd] [0-7] {_HEX} {_HEX}) | '
                   f'("u" [Dd] [89ABab] {_HEX} {_HEX} "\\\\u" [Dd] [C-Fc-f] {_HEX} {_HEX})')
# A number Python reads as a float (a fraction or an exponent) past 1.8e308 is inf ("1e999"), which
# jsonschema-rs takes for null: "not of type number". An unbounded number keeps at most 200 integer
# digits and a 2-digit exponent, below 1e300 (basic_number, or a number's own rules under a $ref).
_NUMBER_INT = re.compile(r'^(\w+) ::= \(\("0"\) \| \(\[1-9\] \[0-9\]\*\)\)$', re.M)
_NUMBER_EXP = re.compile(r'^(\w+ ::= \("" \| \(\[eE\] \w+ \w+_digits)\{1, -1\}\)\)$', re.M)


# The validator reads a pattern as ECMA-262, whose \s also holds these spaces and whose . stops at
# these line ends; xgrammar's \S, [^\s] and . took them (a reply the grammar allowed and the validator refused).
_ECMA_SPACES = r"\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_NOT_SPACE = rf"[^\s{_ECMA_SPACES}]"
_ECMA_DOT = r"[^\n\r\u2028\u2029]"
_HEX_PAIR = re.compile("[0-9A-Fa-f]{2}")


def _ecma_pattern(pattern: str) -> str:
    r"""``pattern`` as xgrammar must read it to allow no more than the validator: \S, [^\s] and . spelled out,
    and \xHH as \u00HH (xgrammar reads the hex digits after it on, ECMA-262 two)."""
    out, i, cls = [], 0, None  # cls: (negated, tokens) of the class being read
    while i < len(pattern):
        token = pattern[i:i + 2] if pattern[i] == "\\" else pattern[i]
        i += len(token)
        if token == "\\x" and _HEX_PAIR.fullmatch(pattern[i:i + 2]):  # xgrammar read \x41b as U+041B, not "Ab"
            token, i = f"\\u00{pattern[i:i + 2]}", i + 2
        if cls is None and token == "[":
            negated = pattern.startswith("^", i)
            cls, i = (negated, []), i + negated
        elif cls is None:
            out.append(_NOT_SPACE if token == "\\S" else _ECMA_DOT if token == "." else token)
        elif token != "]":
            cls[1].append(token + _ECMA_SPACES if cls[0] and token == "\\s" else token)
        else:
            (negated, tokens), cls = cls, None
            if negated or "\\S" not in tokens:
                out.append(f"[{'^' * negated}{''.join(tokens)}]")
            else:  # a class holds no [^...]: \S becomes an alternative beside the rest
                rest = "".join(t for t in tokens if t != "\\S")
                out.append(f"(?:{_NOT_SPACE}|[{rest}])" if rest else _NOT_SPACE)
    return "".join(out) if cls is None else pattern  # an unclosed class: xgrammar refuses it as it is


def _searched(pattern: str) -> str:
    r"""``pattern`` as xgrammar, which matches a pattern whole, must read it to match what the validator's
    search finds: an alternative not anchored at a side (``^tests/``, ``[a-z]``) takes any text there."""
    alternatives, tokens, depth, i = [], [], 0, 0
    while i < len(pattern):
        token = pattern[i:i + 2] if pattern[i] == "\\" else pattern[i]
        if token == "[":  # a class, whole: its | ( ) are characters
            end = i + 1
            while end < len(pattern) and pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            token = pattern[i:end + 1]
        i += len(token)
        depth += (token == "(") - (token == ")")
        if token == "|" and depth == 0:
            alternatives.append(tokens)
            tokens = []
        else:
            tokens.append(token)
    alternatives.append(tokens)
    if len(alternatives) == 1 and tokens[:1] == ["^"] and tokens[-1:] == ["$"]:
        return pattern
    if any("^" in t[1:] or "$" in t[:-1] for t in alternatives):  # an anchor in a group ("(^a|^b)"): as it was, stricter
        return pattern
    anything = r"[\s\S]*"
    spelled = [("" if t[:1] == ["^"] else anything) + "".join(t[t[:1] == ["^"]:len(t) - (t[-1:] == ["$"])])
               + ("" if t[-1:] == ["$"] else anything) for t in alternatives]
    return spelled[0] if len(spelled) == 1 else f"(?:{'|'.join(spelled)})"


def _ecma_patterns(schema: Any) -> None:
    """Rewrite (in place) the patterns xgrammar compiles in a parsed schema with _ecma_pattern and _searched."""
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("pattern"), str):
        schema["pattern"] = _searched(_ecma_pattern(schema["pattern"]))
    if isinstance(schema.get("patternProperties"), dict):
        schema["patternProperties"] = {_searched(_ecma_pattern(k)): v for k, v in schema["patternProperties"].items()}
    for _, sub in subschemas(schema):
        _ecma_patterns(sub)


def _min_length_string(match: re.Match) -> str:
    return f'{match[1]} ::= (("\\"" {" ".join([_JSON_CHAR] * int(match[2]))} basic_string_sub))'


def tight_grammar(json_schema: str) -> Any:
    """The xgrammar Grammar of a schema's messages, tight whitespace, properties in declared order."""
    schema = json.loads(json_schema)
    check_enforceable(schema)
    _ecma_patterns(schema)
    xgr = xgrammar()
    try:
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
    except RuntimeError as exc:  # xgrammar reports conversion errors as RuntimeError with a C++ prefix
        raise compile_error(exc) from None
    text = str(grammar)
    if "basic_string_sub ::=" in text and "basic_escape ::=" in text:
        text = _MIN_ONLY.sub(_min_length_string, text)
    text = _NUMBER_INT.sub(r'\1 ::= (("0") | ([1-9] [0-9]{0, 199}))', text)
    text = _NUMBER_EXP.sub(r'\1{1, 2}))', text)
    text = _LENGTH_CHARS.sub(r'\1 ::= (([^\\0-\\x1f\\"\\\\]))', text)
    # UTF-8-encoded surrogates (\xed\xa0-\xbf..) pass xgrammar's string classes: not UTF-8, they
    # decode as 3 replacement characters each, past a maxLength.
    text = text.replace("[^\\0-\\x1f", "[^\\0-\\x1f\\uD800-\\uDFFF")
    # ... and so do their escapes: parse_message refuses a lone one (\udc00), and a pair (\ud83d\ude00)
    # is one character, not the two a minLength counted.
    text = text.replace(_HEX_ESCAPE, _UNICODE_ESCAPE)
    try:  # else no reply ends: the mask is empty at the value (the sampled token fails the request), or it nests on
        empty = derives_nothing(text)
    except EbnfError:  # a grammar the quotient does not parse (only vLLM needs it to): not judged here
        empty = False
    if empty:
        raise GrammarError(CYCLE)
    return xgr.Grammar.from_ebnf(text) if text != str(grammar) else grammar


@lru_cache(maxsize=256)
def grammar_after(json_schema: str, prefix: str = "") -> str:
    """The EBNF (xgrammar's dialect) of what may follow ``prefix`` in a message of the schema:
    for backends that take a grammar, not a matcher that has read the prefix (vLLM)."""
    try:
        return quotient(str(tight_grammar(json_schema)), prefix)
    except EbnfError as exc:
        raise GrammarError(f"reply_prefix {prefix!r}: {exc}", key="reply_prefix") from None


_NO_VOCAB: Any = None


def _text_matcher(grammar: Any) -> Any:
    """A matcher of ``grammar`` that reads text: over an empty vocabulary, no tokenizer needed."""
    global _NO_VOCAB
    xgr = xgrammar()
    if _NO_VOCAB is None:
        _NO_VOCAB = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1)
    return xgr.GrammarMatcher(_NO_VOCAB.compile_grammar(grammar), terminate_without_stop_token=True)


@lru_cache(maxsize=256)  # a training run checks each role before its model loads and again as it binds it
def check_reply_prefix(json_schema: str, prefix: str) -> None:
    """Raise GrammarError unless the schema compiles and ``prefix`` starts a message it allows."""
    matcher = _text_matcher(tight_grammar(json_schema))
    if prefix and not matcher.accept_string(prefix):
        raise GrammarError(
            f"reply_prefix {prefix!r} does not start a message the schema allows (constrained decoding "
            "writes compact JSON with ', ' and ': ' and properties in the schema's order)", key="reply_prefix"
        )


@lru_cache(maxsize=256)
def check_free_reply_prefix(json_schema: str, prefix: str) -> None:
    """Raise GrammarError where the JSON ``prefix`` opens (from its first ``{``: free replies may
    start with chatter) starts no message of the schema in any spacing, a misspelt key say: every
    reply starts with it, so every turn would be invalid. Properties are read in the schema's
    order; a schema xgrammar cannot compile (free decoding takes any) is not judged."""
    if (start := prefix.find("{")) == -1:
        return
    try:
        grammar = xgrammar().Grammar.from_json_schema(json_schema, any_whitespace=True, strict_mode=False)
    except RuntimeError:
        return
    if not _text_matcher(grammar).accept_string(prefix[start:]):
        raise GrammarError(f"reply_prefix {prefix!r} does not start a message the schema allows, so no reply "
                           "could be valid (properties in the schema's order)", key="reply_prefix")
