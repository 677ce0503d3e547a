"""The grammar of what may follow a given prefix, from an xgrammar EBNF grammar.

A role's reply prefix (``{"verdict": "``) sits in the prompt, so the model samples only the rest
of the message. The HF engine feeds the prefix to its grammar matcher before sampling; a backend
that takes a grammar but not a matcher state (vLLM's structured outputs) needs the grammar of
the rest instead: the left quotient { s : prefix + s in L(G) }.

It is taken one character at a time as a Brzozowski derivative of the grammar:
    D_c("c" w) = "w"            D_c([set]) = "" if c in set       D_c(A) = A_c, a new rule with body D_c(body(A))
    D_c(X Y) = D_c(X) Y | D_c(Y) where X can be empty             D_c(X | Y) = D_c(X) | D_c(Y)
    D_c(X{m,n}) = D_c(X) X{max(m-1, 0), n-1}
Rules derived from the same rule by the same character are shared (memoised before their bodies
are built, so recursion terminates), then rules that derive no string are pruned. A derived
rule keeps its rule's lookahead: it is followed by whatever followed the rule.

Only what xgrammar prints for a grammar (``str(Grammar)``) is parsed: one rule per line, string
literals, character classes, rule names, groups, ``|``, ``*``/``+``/``?``/``{m, n}`` and a rule's
trailing lookahead ``(=(...))``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import count
from typing import Union

# expressions, as plain tuples: ("lit", text), ("cls", negated, ((lo, hi), ...)), ("ref", name),
# ("seq", items), ("alt", options), ("rep", expr, min, max); max INF = unbounded
Expr = Union[tuple, None]  # None: the empty language
EPSILON: tuple = ("seq", ())
INF = -1

_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= (.*)$")
# xgrammar's spelling of a string pattern from a JSON schema (json_string: the pattern's text
# sits inside a JSON string, where xgrammar allows no escapes, quotes or control characters)
_REGEX_MACRO = re.compile(r'Regex\("((?:[^"\\]|\\.)*)"(?:, json_string=(true|false))?\)')
_JSON_UNSAFE = ((0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\")))
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "0": "\0", "b": "\b", "f": "\f", "v": "\v", "a": "\a", "e": "\x1b"}


class EbnfError(ValueError):
    """Text this module does not parse, or a prefix the grammar does not allow."""


@dataclass
class Rule:
    body: Expr
    lookahead: Expr = None


# -- parsing -----------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str):
        self.text, self.i = text, 0

    def error(self, what: str) -> EbnfError:
        return EbnfError(f"{what} at column {self.i + 1} of {self.text!r}")

    def peek(self, s: str) -> bool:
        return self.text.startswith(s, self.i)

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i] == " ":
            self.i += 1

    def rule(self) -> Rule:
        body = self.alt()
        self.skip()
        lookahead = None
        if self.peek("(="):
            self.i += 2
            lookahead = self.alt()
            self.expect(")")
        self.skip()
        if self.i != len(self.text):
            raise self.error("unexpected text")
        return Rule(body, lookahead)

    def expect(self, s: str) -> None:
        self.skip()
        if not self.peek(s):
            raise self.error(f"expected {s!r}")
        self.i += len(s)

    def alt(self) -> Expr:
        options = [self.seq()]
        self.skip()
        while self.peek("|"):
            self.i += 1
            options.append(self.seq())
            self.skip()
        return alt(options)

    def seq(self) -> Expr:
        items = []
        while True:
            self.skip()
            if self.i >= len(self.text) or self.peek("|") or self.peek(")") or self.peek("(="):
                return seq(items)
            items.append(self.postfix())

    def postfix(self) -> Expr:
        e = self.atom()
        while True:
            if self.peek("*"):
                e, self.i = rep(e, 0, INF), self.i + 1
            elif self.peek("+"):
                e, self.i = rep(e, 1, INF), self.i + 1
            elif self.peek("?"):
                e, self.i = rep(e, 0, 1), self.i + 1
            elif self.peek("{"):
                m = re.compile(r"\{\s*(\d+)\s*(?:,\s*(-?\d+)?\s*)?\}").match(self.text, self.i)
                if not m:
                    raise self.error("bad repetition")
                low = int(m[1])
                high = low if "," not in m[0] else (INF if m[2] is None else int(m[2]))
                e, self.i = rep(e, low, high), m.end()
            else:
                return e

    def atom(self) -> Expr:
        if self.peek('"'):
            self.i += 1
            out = []
            while not self.peek('"'):
                out.append(self.char())
            self.i += 1
            return ("lit", "".join(out))
        if self.peek("["):
            self.i += 1
            negated = self.peek("^")
            self.i += negated
            ranges = []
            while not self.peek("]"):
                lo = self.char()
                hi = lo
                if self.peek("-") and not self.text.startswith("-]", self.i):
                    self.i += 1
                    hi = self.char()
                ranges.append((ord(lo), ord(hi)))
            self.i += 1
            return ("cls", negated, tuple(ranges))
        if self.peek("("):
            self.i += 1
            e = self.alt()
            self.expect(")")
            return e
        m = _REGEX_MACRO.match(self.text, self.i)
        if m:
            self.i = m.end()
            return ("regex", _unescape(m[1]), m[2] == "true")
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.i)
        if not m or self.text.startswith("(", m.end()):  # another macro (TagDispatch...)
            raise self.error("unsupported element")
        self.i = m.end()
        return ("ref", m[0])

    def char(self) -> str:
        if self.i >= len(self.text):
            raise self.error("unterminated literal or class")
        c, self.i = _char_at(self.text, self.i)
        return c


def _char_at(text: str, i: int) -> tuple[str, int]:
    """The character an EBNF literal spells at ``i`` (escapes decoded), and where the next starts."""
    if text[i] != "\\":
        return text[i], i + 1
    c = text[i + 1]
    width = {"x": 2, "u": 4, "U": 8}.get(c)
    if width:
        return chr(int(text[i + 2:i + 2 + width], 16)), i + 2 + width
    return _ESCAPES.get(c, c), i + 2


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c, i = _char_at(text, i)
        out.append(c)
    return "".join(out)


def parse(text: str) -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _RULE.match(line)
        if not m:
            raise EbnfError(f"not a rule: {line!r}")
        rules[m[1]] = _Parser(m[2]).rule()
    if "root" not in rules:
        raise EbnfError("the grammar has no root rule")
    for name in list(rules):
        rule = rules[name]
        rule.body = _expand_regexes(rule.body, rules, name)
    return rules


def _expand_regexes(e: Expr, rules: dict[str, Rule], owner: str) -> Expr:
    """Regex macros as rules of their own (xgrammar's translation of the pattern, inlined)."""
    if e is None or e[0] in ("lit", "cls", "ref"):
        return e
    if e[0] == "regex":
        import xgrammar

        sub = parse(str(xgrammar.Grammar.from_regex(e[1])))
        stem = f"{owner}_re{len(rules)}"
        renamed = {name: f"{stem}_{name}" for name in sub}
        for name, rule in sub.items():
            body = _rename(rule.body, renamed)
            rules[renamed[name]] = Rule(_json_safe(body) if e[2] else body)
        return ("ref", renamed["root"])
    if e[0] == "rep":
        return rep(_expand_regexes(e[1], rules, owner), e[2], e[3])
    parts = [_expand_regexes(x, rules, owner) for x in e[1]]
    return seq(parts) if e[0] == "seq" else alt(parts)


def _rename(e: Expr, names: dict[str, str]) -> Expr:
    if e is None or e[0] in ("lit", "cls"):
        return e
    if e[0] == "ref":
        return ("ref", names.get(e[1], e[1]))
    if e[0] == "rep":
        return rep(_rename(e[1], names), e[2], e[3])
    parts = [_rename(x, names) for x in e[1]]
    return seq(parts) if e[0] == "seq" else alt(parts)


def _json_safe(e: Expr) -> Expr:
    """``e`` without quotes, backslashes and control characters (a pattern inside a JSON string)."""
    if e is None or e[0] == "ref":
        return e
    if e[0] == "lit":
        return None if any(_unsafe(ord(c)) for c in e[1]) else e
    if e[0] == "cls":
        if e[1]:  # negated: ban the unsafe ones too
            return ("cls", True, e[2] + _JSON_UNSAFE)
        return alt([("cls", False, (r,)) for lo, hi in e[2] for r in _safe_ranges(lo, hi)])
    if e[0] == "rep":
        return rep(_json_safe(e[1]), e[2], e[3])
    parts = [_json_safe(x) for x in e[1]]
    return seq(parts) if e[0] == "seq" else alt(parts)


def _unsafe(code: int) -> bool:
    return any(lo <= code <= hi for lo, hi in _JSON_UNSAFE)


def _safe_ranges(lo: int, hi: int) -> list[tuple[int, int]]:
    """[lo, hi] minus the unsafe characters, as ranges."""
    out, start = [], lo
    for bad_lo, bad_hi in sorted(_JSON_UNSAFE):
        if bad_hi < start or bad_lo > hi:
            continue
        if bad_lo > start:
            out.append((start, bad_lo - 1))
        start = max(start, bad_hi + 1)
    if start <= hi:
        out.append((start, hi))
    return out


# -- smart constructors ----------------------------------------------------------------------
def seq(items) -> Expr:
    flat: list = []
    for x in items:
        if x is None:
            return None
        if x[0] == "seq":
            flat += x[1]
        elif x != ("lit", ""):
            flat.append(x)
    return flat[0] if len(flat) == 1 else ("seq", tuple(flat))


def alt(options) -> Expr:
    out: list = []
    for x in options:
        for o in (x[1] if x is not None and x[0] == "alt" else (x,)):
            if o is not None and o not in out:
                out.append(o)
    if not out:
        return None
    return out[0] if len(out) == 1 else ("alt", tuple(out))


def rep(x: Expr, low: int, high: int) -> Expr:
    if high == 0:
        return EPSILON
    if x is None:
        return EPSILON if low == 0 else None
    if (low, high) == (1, 1):
        return x
    return ("rep", x, low, high)


# -- the derivative --------------------------------------------------------------------------
class _Quotient:
    def __init__(self, rules: dict[str, Rule]):
        self.rules = dict(rules)
        self.memo: dict[tuple[str, str], str] = {}
        self.names = count()
        self.stems: dict[str, str] = {}  # derived rule -> the grammar's rule it comes from
        self.nullable_rules: set[str] = set()

    def after(self, prefix: str) -> Expr:
        """The root's derivative by ``prefix``, a character at a time."""
        root: Expr = ("ref", "root")
        for c in prefix:
            # Only rules of earlier steps are asked whether they can be empty, and they are complete.
            self.nullable_rules = self._fixpoint(lambda e, known: self.nullable(e, known))
            root = self.d(root, c)
        return root

    def fresh(self, source: str) -> str:
        stem = self.stems.get(source, source)
        name = f"{stem}_q{next(self.names)}"
        if name in self.rules:
            return self.fresh(source)
        self.stems[name] = stem
        return name

    def _fixpoint(self, test) -> set[str]:
        known: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, rule in self.rules.items():
                if name not in known and test(rule.body, known):
                    known.add(name)
                    changed = True
        return known

    def nullable(self, e: Expr, known: set[str] | None = None) -> bool:
        known = self.nullable_rules if known is None else known
        if e is None:
            return False
        kind = e[0]
        if kind == "lit":
            return e[1] == ""
        if kind == "cls":
            return False
        if kind == "ref":
            return e[1] in known
        if kind == "seq":
            return all(self.nullable(x, known) for x in e[1])
        if kind == "alt":
            return any(self.nullable(x, known) for x in e[1])
        return e[2] == 0 or self.nullable(e[1], known)  # rep

    def d(self, e: Expr, c: str) -> Expr:
        if e is None:
            return None
        kind = e[0]
        if kind == "lit":
            return ("lit", e[1][1:]) if e[1][:1] == c else None
        if kind == "cls":
            inside = any(lo <= ord(c) <= hi for lo, hi in e[2])
            return EPSILON if inside != e[1] else None
        if kind == "ref":
            return ("ref", self.rule_d(e[1], c))
        if kind == "seq":
            items, options = e[1], []
            for i, x in enumerate(items):
                options.append(seq((self.d(x, c),) + items[i + 1:]))
                if not self.nullable(x):
                    break
            return alt(options)
        if kind == "alt":
            return alt([self.d(x, c) for x in e[1]])
        x, low, high = e[1], e[2], e[3]
        return seq((self.d(x, c), rep(x, max(low - 1, 0), INF if high == INF else high - 1)))

    def rule_d(self, name: str, c: str) -> str:
        key = (name, c)
        if key not in self.memo:
            new = self.fresh(name)
            self.memo[key] = new
            self.rules[new] = Rule(None, self.rules[name].lookahead)  # a placeholder while recursing
            self.rules[new] = Rule(self.d(self.rules[name].body, c), self.rules[name].lookahead)
        return self.memo[key]

    def productive(self) -> set[str]:
        def test(e: Expr, known: set[str]) -> bool:
            if e is None:
                return False
            kind = e[0]
            if kind in ("lit", "cls"):
                return True
            if kind == "ref":
                return e[1] in known
            if kind == "seq":
                return all(test(x, known) for x in e[1])
            if kind == "alt":
                return any(test(x, known) for x in e[1])
            return e[2] == 0 or test(e[1], known)

        return self._fixpoint(test)


def _prune(e: Expr, alive: set[str]) -> Expr:
    """``e`` without the references to rules that derive nothing."""
    if e is None:
        return None
    kind = e[0]
    if kind == "ref":
        return e if e[1] in alive else None
    if kind == "seq":
        return seq(_prune(x, alive) for x in e[1])
    if kind == "alt":
        return alt([_prune(x, alive) for x in e[1]])
    if kind == "rep":
        return rep(_prune(e[1], alive), e[2], e[3])
    return e


def _refs(e: Expr) -> list[str]:
    if e is None or e[0] in ("lit", "cls"):
        return []
    if e[0] == "ref":
        return [e[1]]
    if e[0] == "rep":
        return _refs(e[1])
    return [name for x in e[1] for name in _refs(x)]


def derives_nothing(text: str) -> bool:
    """Whether ``text``'s grammar allows no string at all (its root only ever refers back to itself)."""
    return "root" not in _Quotient(parse(text)).productive()


def quotient(text: str, prefix: str) -> str:
    """The EBNF (xgrammar's dialect) of the strings ``s`` that ``text``'s grammar allows after ``prefix``."""
    q = _Quotient(parse(text))
    q.rules["__rest"] = Rule(q.after(prefix))
    alive = q.productive()
    if "__rest" not in alive:
        raise EbnfError(f"the grammar allows no message that starts with {prefix!r}")
    # keep what the new root reaches, pruned; it becomes "root" (the old one is renamed away)
    order, todo = [], ["__rest"]
    while todo:
        name = todo.pop()
        if name in order:
            continue
        order.append(name)
        rule = q.rules[name]
        rule.body, rule.lookahead = _prune(rule.body, alive), _prune(rule.lookahead, alive)
        todo += [r for r in _refs(rule.body) + _refs(rule.lookahead) if r in alive]
    rename = {"root": q.fresh("root"), "__rest": "root"}
    return "".join(_render_rule(rename.get(name, name), q.rules[name], rename) for name in order)


def _render_rule(name: str, rule: Rule, rename: dict[str, str]) -> str:
    if rule.lookahead is None:
        return f"{name} ::= {_render(rule.body, rename)}\n"
    # grouped, or xgrammar reads the lookahead as the last alternative's
    return f"{name} ::= {_group(rule.body, rename)} (={_group(rule.lookahead, rename)})\n"


# -- rendering -------------------------------------------------------------------------------
def _char(code: int, special: str) -> str:
    c = chr(code)
    if c in special or c == "\\":
        return "\\" + c
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if 0xD800 <= code <= 0xDFFF:  # a surrogate, excluded from string classes: no UTF-8 of its own
        return f"\\u{code:04x}"
    return c


def _render(e: Expr, rename: dict[str, str]) -> str:
    kind = e[0]
    if kind == "lit":
        return '"' + "".join(_char(ord(c), '"') for c in e[1]) + '"'
    if kind == "cls":
        body = "".join(_char(lo, "]-^") + ("" if lo == hi else "-" + _char(hi, "]-^")) for lo, hi in e[2])
        return "[" + ("^" if e[1] else "") + body + "]"
    if kind == "ref":
        return rename.get(e[1], e[1])
    if kind == "seq":
        return " ".join(_group(x, rename) if x[0] == "alt" else _render(x, rename) for x in e[1]) if e[1] else '""'
    if kind == "alt":
        return " | ".join(_render(x, rename) for x in e[1])
    x, low, high = e[1], e[2], e[3]
    return f"{_group(x, rename) if x[0] in ('seq', 'alt') else _render(x, rename)}{{{low}, {high}}}"


def _group(e: Expr, rename: dict[str, str]) -> str:
    return f"({_render(e, rename)})"
