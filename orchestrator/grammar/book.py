"""Masks from grammars: ``GrammarBook`` (one per tokenizer: compiled grammars, byte tokens, the
shortest closing of a message), ``ConstrainedRow`` (a request's matcher and length budget) and the
bitmask helpers the engine and the training client share."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Generic, Sequence, TypeVar

import numpy as np
import structlog
import torch

from ..engines.tokens import end_of_turn_ids, turn_end_id
from .errors import compile_error
from .schema import GrammarError, tight_grammar, xgrammar
from .spelling import MAX_BRANCH, MAX_NODES, MAX_TEXTS, Spellings

log = structlog.get_logger()

MARGIN = 16  # look at the budget every step once fewer than this many spare tokens are left
CHECK_EVERY = 16  # ... and at least this often before that: a closing can grow as a message nests
MAX_CLOSING_BYTES = 512
SEARCH_NODES = 4096  # breadth-first fallback for closings the greedy walk misses (patterns)
MAX_SAME_MASK = 8  # bytes in a row under one mask before the greedy walk takes itself to be looping
MAX_SCHEMAS = 256  # compiled grammars (and spellings) kept: `rolecast serve` takes any schema a client sends


class GrammarBook:
    """What one tokenizer needs: compiled grammars (once per schema), its byte tokens, closings.

    Shared by the engine's scheduler thread and the training client's worker: compiling is
    locked, everything else works on per-call state.
    """

    def __init__(self, tokenizer: Any, vocab_size: int):
        xgr = xgrammar()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stops = stops = sorted(end_of_turn_ids(tokenizer))
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stops)
        # what a forced closing ends with: the template's end of turn, so a later turn can continue it
        self.eos = tokenizer.eos_token_id if (end := turn_end_id(tokenizer)) is None else end
        self.width = (vocab_size + 31) // 32  # int32 words per bitmask row
        # no cache of its own: it would keep every schema's grammar that ours let go
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        self._compiled: _Recent[str, Any] = _Recent(MAX_SCHEMAS)
        self._spellings: _Recent[tuple[str, str], Spellings | None] = _Recent(MAX_SCHEMAS)
        self._lock = threading.Lock()
        self._batch = xgr.BatchGrammarMatcher(max_threads=2)
        # The token spelling each single byte (byte-level vocabularies have all 256): closings are
        # searched byte by byte, then re-tokenised.
        ids = np.full(256, -1, dtype=np.int64)
        for token_id, raw in enumerate(self.info.decoded_vocab):
            if len(raw) == 1 and ids[raw[0]] < 0 and token_id not in stops:
                ids[raw[0]] = token_id
        self._byte_ids = ids
        self._byte_has = ids >= 0
        safe = np.where(self._byte_has, ids, 0)
        self._byte_word, self._byte_bit = safe // 32, (safe % 32).astype(np.int32)

    # -- grammars and matchers -----------------------------------------------------------------
    def compiled(self, json_schema: str) -> Any:
        """The schema's compiled grammar; the first call per schema compiles (ms to seconds)."""
        grammar = self._compiled.get(json_schema)  # a compiled one is not kept waiting behind a compile
        if grammar is not None:
            return grammar
        with self._lock:
            grammar = self._compiled.get(json_schema)
            if grammar is None:
                try:
                    grammar = self._compiler.compile_grammar(tight_grammar(json_schema))
                except RuntimeError as exc:  # what only the real vocabulary shows (the check at load has none)
                    raise compile_error(exc) from None
                self._compiled[json_schema] = grammar
            return grammar

    def matcher(self, json_schema: str, prefix: str = "") -> Any:
        """A fresh matcher that has already read ``prefix`` (the reply text already in the prompt)."""
        matcher = xgrammar().GrammarMatcher(self.compiled(json_schema))
        if prefix and not matcher.accept_string(prefix):
            raise GrammarError(f"reply_prefix {prefix!r} does not start a message the schema allows", key="reply_prefix")
        return matcher

    def spellings(self, json_schema: str, prefix: str = "") -> Spellings | None:
        """The tokenizer's spellings of every text the schema allows after ``prefix``, when those
        are few (``spelling.py``); None for larger languages (free text, numbers)."""
        key = (json_schema, prefix)
        found = self._spellings.get(key, self)  # None is an answer: not a small language
        if found is self:
            found = None
            texts = self._finite_texts(self.matcher(json_schema, prefix))
            if texts is not None:
                found = []
                for text in texts:
                    ids = self.tokenizer.encode(text.decode("utf-8", errors="strict"), add_special_tokens=False)
                    probe = self.matcher(json_schema, prefix)
                    if not (all(probe.accept_token(t) for t in ids) and probe.is_completed()):
                        found = None  # the tokenizer's spelling is not one the grammar takes: leave it be
                        break
                    found.append(ids)
            found = self._spellings[key] = found and Spellings(found, self.width, self.stops)
        return found

    def _finite_texts(self, matcher: Any) -> list[bytes] | None:
        """Every complete text from ``matcher``'s state, byte by byte; None past the limits."""
        row, texts, frontier, nodes = self.new_bitmask(1), [], [(matcher.fork(), b"")], 0
        while frontier:
            node, text = frontier.pop()
            node.fill_next_token_bitmask(row)
            allowed = np.flatnonzero(self._allowed_bytes(row[0]))
            if node.is_completed():
                texts.append(text)
            if len(allowed) > MAX_BRANCH or len(texts) > MAX_TEXTS:
                return None
            for byte in allowed:
                nodes += 1
                if nodes > MAX_NODES:
                    return None
                child = node.fork()
                child.accept_token(int(self._byte_ids[byte]))
                frontier.append((child, text + bytes([int(byte)])))
        try:
            [t.decode("utf-8") for t in texts]
        except UnicodeDecodeError:
            return None
        return texts or None

    def new_bitmask(self, rows: int) -> torch.Tensor:
        return torch.full((rows, self.width), -1, dtype=torch.int32)

    def fill(self, matchers: list[Any], bitmask: torch.Tensor, rows: list[int]) -> None:
        """Fill ``bitmask[rows[i]]`` with the next-token mask of ``matchers[i]``, in one call."""
        self._batch.batch_fill_next_token_bitmask(matchers, bitmask, rows)

    # -- closing a message ---------------------------------------------------------------------
    def closing(self, matcher: Any) -> list[int] | None:
        """Tokens of a shortest text that completes the message from ``matcher``'s state.

        [] when it is complete; None when no closing was found (regex patterns can defeat the
        search). The matcher itself is not changed.
        """
        if matcher.is_completed():
            return []
        text = self._greedy_closing(matcher) or self._searched_closing(matcher)
        return None if text is None else self._tokens_for(matcher, text)

    def _allowed_bytes(self, row: torch.Tensor) -> np.ndarray:
        words = row.numpy()[self._byte_word]
        return self._byte_has & (((words >> self._byte_bit) & 1) == 1)

    def _greedy_closing(self, matcher: Any) -> bytes | None:
        """Walk the grammar one byte at a time, closing quotes and brackets first.

        The choice depends only on the mask: when bytes leave the mask as it was, the walk may
        repeat them forever (a pattern like ``.+\\.py``), so after ``MAX_SAME_MASK`` in a row it
        gives up (one alone is no sign: the key after ``"key1`` in ``key11``).
        """
        probe, row, out, last, same = matcher.fork(), self.new_bitmask(1), bytearray(), b"", 0
        while len(out) < MAX_CLOSING_BYTES:
            probe.fill_next_token_bitmask(row)
            mask = row.numpy().tobytes()
            same = same + 1 if mask == last else 0
            if same >= MAX_SAME_MASK:
                return None
            last = mask
            byte = _preferred(self._allowed_bytes(row[0]))
            if byte is None or not probe.accept_token(int(self._byte_ids[byte])):
                return None
            out.append(byte)
            if probe.is_completed():
                return bytes(out)
        return None

    def _searched_closing(self, matcher: Any) -> bytes | None:
        """Breadth-first over bytes, within SEARCH_NODES steps.

        States with the same parser items merge (``_state_key``); the first reached is the
        shorter. The items point back into history, so two merged states may differ there: that
        can only lose a closing, never yield a wrong one (every byte went through the matcher).
        """
        row = self.new_bitmask(1)
        frontier, steps, seen = [(matcher.fork(), b"")], 0, set()
        while frontier and steps < SEARCH_NODES:
            nodes, frontier = frontier, []
            for node, text in nodes:
                node.fill_next_token_bitmask(row)
                for byte in _by_preference(self._allowed_bytes(row[0])):
                    steps += 1
                    node.accept_token(int(self._byte_ids[byte]))
                    if node.is_completed():
                        return text + bytes([byte])
                    key = _state_key(node, row)
                    if key not in seen:
                        seen.add(key)
                        frontier.append((node.fork(), text + bytes([byte])))
                    node.rollback(1)
        return None

    def _tokens_for(self, matcher: Any, text: bytes) -> list[int]:
        """``text`` as the tokenizer spells it when the matcher takes that, else byte by byte."""
        try:
            ids = self.tokenizer.encode(text.decode("utf-8"), add_special_tokens=False)
            probe = matcher.fork()
            if all(probe.accept_token(t) for t in ids) and probe.is_completed():
                return list(ids)
        except UnicodeDecodeError:  # the closing finishes a character the last token began
            pass
        return [int(self._byte_ids[b]) for b in text]

    # -- training --------------------------------------------------------------------------------
    def replay(self, json_schema: str, prefix: str, tokens: Sequence[int], rows: Sequence[int],
               spelled: bool = False) -> torch.Tensor:
        """The masks ``tokens[i]`` were sampled under, for each i in ``rows`` (ascending): [len(rows), width].

        ``spelled``: the sampler cut its masks to the tokenizer's spellings (``spellings``)."""
        matcher, out = self.matcher(json_schema, prefix), self.new_bitmask(len(rows))
        spellings, node = self.spellings(json_schema, prefix) if spelled else None, 0
        wanted = {i: k for k, i in enumerate(rows)}
        for i, token in enumerate(tokens):
            if i in wanted:
                matcher.fill_next_token_bitmask(out, wanted[i])
                if spellings is not None:
                    spellings.restrict(node, out[wanted[i]])
            if not matcher.accept_token(int(token)):
                raise GrammarError(f"token {token} at position {i} breaks the schema: not sampled under it")
            node = spellings.step(node, int(token)) if spellings is not None else None
        return out


def _state_key(matcher: Any, row: torch.Tensor) -> Any:
    """The parser's current items: masks alone cannot tell regex states apart (after ``tests/a``
    and ``tests/a.`` under ``.+\\.py`` no token differs). xgrammar has no public state id, so
    this reads its debug dump, and falls back to the mask where that is missing."""
    dump = getattr(matcher, "_debug_print_internal_state", None)
    if dump is not None:
        return dump().partition("Last step:")[2]
    matcher.fill_next_token_bitmask(row)
    return row.numpy().tobytes()


# Byte preferences of a closing walk: end strings, close containers, smallest scalars; inside
# free text (a string that may not end yet) letters come before punctuation. Where no letter may
# come (between values, in a number) closing and the next key come before digits: a number only
# grows, and an object or array opened empty (``{}``, ``[]``) may close at once.
def _ranks(order: bytes) -> np.ndarray:
    rank = np.full(256, 1000, dtype=np.int64)
    rank[0x20:0x7F] = 500 + np.arange(0x20, 0x7F)  # other printable ASCII
    rank[0x80:] = 800 + np.arange(0x80, 0x100)  # continuation / lead bytes: last resort
    rank[ord("\\")] = 900  # escapes are long
    rank[list(order)] = np.arange(len(order))
    return rank


_STRUCTURE = _ranks(b'"]}0123456789abcdefghijklmnopqrstuvwxyz,: [{')
_BETWEEN = _ranks(b']},"0123456789abcdefghijklmnopqrstuvwxyz: [{')
_FREE_TEXT = _ranks(b'"abcdefghijklmnopqrstuvwxyz0123456789')


def _rank_for(allowed: np.ndarray) -> np.ndarray:
    if not allowed[ord("a")]:
        return _BETWEEN
    free_text = not allowed[ord('"')] and allowed[ord("}")]
    return _FREE_TEXT if free_text else _STRUCTURE


def _preferred(allowed: np.ndarray) -> int | None:
    if not allowed.any():
        return None
    rank = np.where(allowed, _rank_for(allowed), np.iinfo(np.int64).max)
    return int(rank.argmin())


def _by_preference(allowed: np.ndarray) -> list[int]:
    candidates = np.flatnonzero(allowed)
    ascii_ = candidates[candidates < 0x80]
    candidates = ascii_ if ascii_.size else candidates  # non-ASCII only to finish a character
    return candidates[np.argsort(_rank_for(allowed)[candidates], kind="stable")].tolist()


@dataclass(eq=False)
class ConstrainedRow:
    """One request's grammar state in the engine, and its length budget (see the module doc)."""

    book: GrammarBook
    matcher: Any
    max_tokens: int
    next_check: int = 0  # generated-token count at which to look at the budget next
    fallback: list[int] | None = None  # the closing of the state one token back, which fit
    forced: list[int] = field(default_factory=list)  # this step emits these instead of sampling
    rollback: bool = False  # ... after dropping the last sampled token
    hopeless: bool = False  # cannot close within max_tokens: samples on, ends with "length"
    forced_count: int = 0  # tokens the reply was closed with by force
    spellings: Spellings | None = None  # a small language's own spellings (spelling.py)
    nodes: list[int | None] = field(default_factory=lambda: [0])  # trie node after each accepted token

    def restrict(self, row: torch.Tensor) -> None:
        """Cut this step's grammar mask ``row`` to the tokens that continue a spelling."""
        if self.spellings is not None:
            self.spellings.restrict(self.nodes[-1], row)

    def plan(self, produced: int) -> None:
        """Before a step: sample, or close by force (setting ``forced`` / ``rollback``)."""
        self.forced, self.rollback = [], False
        remaining = self.max_tokens - produced
        if self.hopeless or produced < self.next_check:
            self.fallback = None  # only valid the step right after it was computed
            return
        closing = self.book.closing(self.matcher)
        need = None if closing is None else len(closing) + 1  # + the end of turn
        if need is None and remaining > MARGIN:  # the search may succeed further on (a pattern ends)
            self.fallback, self.next_check = None, produced + min(CHECK_EVERY, remaining - MARGIN)
            return
        fallback, self.fallback = self.fallback, None
        if need is not None and need < remaining:
            self.fallback = closing
            self.next_check = produced + max(1, min(CHECK_EVERY, remaining - need - MARGIN))
        elif need == remaining:
            self.forced = closing + [self.book.eos]
        elif fallback is not None:  # the last token left no room: take it back and close before it
            self.forced, self.rollback = fallback + [self.book.eos], True
        elif closing is not None and len(closing) <= remaining:
            self.forced = closing  # valid, but no room left for the end of turn
        else:
            self.hopeless = True
            log.warning("engine.grammar_truncated", max_tokens=self.max_tokens, produced=produced,
                        closing_tokens=None if closing is None else len(closing))

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise GrammarError(f"sampled token {token} is not allowed by the grammar")
        if self.spellings is not None:
            self.nodes.append(self.spellings.step(self.nodes[-1], token))

    def take_forced(self) -> tuple[int, list[int]]:
        """Apply this step's forced closing: (sampled tokens to drop, tokens to append)."""
        drop = 1 if self.rollback else 0
        if drop:
            self.matcher.rollback(1)
            if self.spellings is not None:
                self.nodes.pop()
        for token in self.forced:
            self.accept(token)
        self.forced_count = len(self.forced)
        return drop, self.forced


K = TypeVar("K")
V = TypeVar("V")


class _Recent(Generic[K, V]):
    """A dict that keeps only its ``size`` last used keys; thread-safe."""

    def __init__(self, size: int):
        self._items: OrderedDict[K, V] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: K, default: Any = None) -> Any:
        with self._lock:
            if key not in self._items:
                return default
            self._items.move_to_end(key)
            return self._items[key]

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self._size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


_BOOKS: dict[tuple, GrammarBook] = {}
_BOOKS_LOCK = threading.Lock()


def book_for(tokenizer: Any, vocab_size: int) -> GrammarBook:
    """The process-wide GrammarBook of a tokenizer, so the engine and the trainer compile once."""
    key = (type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""), len(tokenizer), vocab_size)
    with _BOOKS_LOCK:
        book = _BOOKS.get(key)
        if book is None:
            book = _BOOKS[key] = GrammarBook(tokenizer, vocab_size)
        return book


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack int32 bitmask rows [N, W] to booleans [N, vocab_size] (for differentiable masking)."""
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32, device=bitmask.device)) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
