"""Small finite languages are sampled in the tokenizer's own spellings (grammar/spelling.py): one
token path per valid text, in the engine and in the training replay alike."""
from __future__ import annotations

import asyncio
import json
import string

import pytest
import torch
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.grammar.book import GrammarBook
from orchestrator.grammar.schema import GrammarError
from orchestrator.grammar.spelling import Spellings
from orchestrator.messages import schema_json
from support import tiny_engine

MOVE = schema_json({"type": "object", "properties": {"move": {"enum": ["rock", "paper", "scissors"]}},
                    "required": ["move"], "additionalProperties": False})
PREFIX = '{"move": "'
COUNT = schema_json({"enum": [1, 12, 123]})  # "1" is complete and also starts "12"
FREE = schema_json({"type": "object", "properties": {"argument": {"type": "string"}}, "required": ["argument"]})
GUESS = schema_json({"type": "object", "properties": {"guess": {"type": "integer"}}, "required": ["guess"]})


def allowed(row: torch.Tensor) -> set[int]:
    bits = [(int(word) >> k) & 1 for word in row.tolist() for k in range(32)]
    return {i for i, b in enumerate(bits) if b}


@pytest.fixture(scope="module")
def engine():
    e = tiny_engine(max_batch=32)
    yield e
    asyncio.run(e.aclose())


def test_the_trie_allows_what_continues_a_spelling_and_stops_where_a_text_is_complete():
    trie = Spellings([[1, 2], [1, 3], [4], [5], [5, 6]], width=1, stops=[31])
    full = torch.full((1,), -1, dtype=torch.int32)

    def cut(node):
        row = full.clone()
        trie.restrict(node, row)
        return allowed(row)

    assert cut(0) == {1, 4, 5}
    one = trie.step(0, 1)
    assert cut(one) == {2, 3}
    assert cut(trie.step(one, 2)) == {31}  # complete: only the end of turn
    assert cut(trie.step(0, 5)) == {6, 31}  # complete, and a longer text goes on
    assert trie.step(one, 9) is None and trie.step(None, 2) is None
    assert cut(None) == set(range(32))  # off the trie (a forced closing): the grammar's own mask
    row = torch.tensor([0b10], dtype=torch.int32)  # the grammar allows token 1 only
    trie.restrict(0, row)
    assert allowed(row) == {1}  # an AND: never more than the grammar


def test_spellings_are_the_tokenizers_own_and_only_for_small_languages(engine):
    book, tok = engine._grammars, engine.tokenizer
    moves = book.spellings(MOVE, PREFIX)
    assert moves is not None
    expected = [tok.encode(f'{m}"}}', add_special_tokens=False) for m in ("rock", "paper", "scissors")]
    paths = {tuple(seq) for seq in expected}
    assert len(moves.complete) == 3 and all(len(seq) <= 3 for seq in expected)
    whole = book.spellings(MOVE)
    assert whole is not None  # the whole object is a small language too, kept apart from the rest after PREFIX
    assert set(whole.children[0]) != set(moves.children[0])  # its texts start at {
    assert len(book.spellings(COUNT).complete) == 3  # the walk goes on past a complete text: 1, 12, 123
    for schema, prefix in ((FREE, '{"argument": "'), (GUESS, '{"guess": ')):
        assert book.spellings(schema, prefix) is None  # free text, any integer: the grammar alone
    # The grammar alone allows many first tokens after the prefix (pieces of each word); the
    # spellings allow one per move.
    free_row = book.replay(MOVE, PREFIX, expected[0], [0])
    cut_row = book.replay(MOVE, PREFIX, expected[0], [0], spelled=True)
    assert allowed(cut_row[0]) == {seq[0] for seq in paths}
    assert len(allowed(free_row[0])) > len(paths)


def test_a_language_of_up_to_256_texts_is_small(engine):
    """docs/constrained.md: at most 256 texts get the cut, however many bytes their walk takes."""
    def values(n):
        return schema_json({"type": "object", "properties": {"v": {"enum": [f"v{i:03d}" for i in range(n)]}}, "required": ["v"]})

    assert len(engine._grammars.spellings(values(256), '{"v": "').complete) == 256
    assert engine._grammars.spellings(values(257), '{"v": "') is None


def test_a_language_of_up_to_32_next_bytes_at_one_point_is_small(engine):
    """docs/constrained.md: more than 32 different next bytes at one point (an enum of single
    letters) is free text to the walk; 32 are not."""
    def letters(n):
        return schema_json({"type": "object", "properties": {"v": {"enum": list(string.ascii_letters[:n])}}, "required": ["v"]})

    assert len(engine._grammars.spellings(letters(32), '{"v": "').complete) == 32
    assert engine._grammars.spellings(letters(33), '{"v": "') is None


@pytest.mark.parametrize("respell", [lambda text: " " + text, lambda text: text[:-1]], ids=["space-before", "cut-short"])
def test_a_text_the_tokenizer_spells_as_the_grammar_does_not_leaves_the_grammar_alone(engine, respell):
    """SentencePiece tokenizers (Llama 2, Mistral) put a space before a text encoded alone:
    ``paper"}`` comes back as ``▁paper`` ``"}``, which the grammar refuses. A trie without that
    text would never let the policy play paper (and a spelling cut short would end a reply the
    schema has not closed): the language keeps the grammar's mask alone."""
    tok = engine.tokenizer

    class Respelling:
        def encode(self, text, **kwargs):
            return tok.encode(respell(text) if text.startswith("paper") else text, **kwargs)

    book = GrammarBook(tok, engine._grammars.vocab_size)
    book.tokenizer = Respelling()
    assert book.spellings(MOVE, PREFIX) is None


def test_a_replay_of_some_positions_gives_each_its_own_mask(engine):
    """Training replays only the action positions (a forced closing's are left out): row k is
    the mask of position rows[k], not of position k."""
    book, tok = engine._grammars, engine.tokenizer
    rock = tok.encode('rock"}', add_special_tokens=False) + [book.eos]
    for spelled in (False, True):
        every = book.replay(MOVE, PREFIX, rock, range(len(rock)), spelled=spelled)
        some = book.replay(MOVE, PREFIX, rock, [1, len(rock) - 1], spelled=spelled)
        assert torch.equal(some, every[[1, len(rock) - 1]]) and not torch.equal(every[0], every[1])


def test_a_replayed_token_the_schema_refuses_is_an_error(engine):
    book, tok = engine._grammars, engine.tokenizer
    rock = tok.encode('rock"}', add_special_tokens=False)
    (x,) = tok.encode("x", add_special_tokens=False)  # no move goes on with an x
    with pytest.raises(GrammarError, match=f"token {x} at position 1 breaks the schema"):
        book.replay(MOVE, PREFIX, [rock[0], x], [0, 1], spelled=True)


def generate(engine, schema, prefix, seeds, temperature=1.5, max_tokens=12):
    prompt = engine.apply_chat_template([{"role": "user", "content": "Rock, paper or scissors?"}]) + engine.encode(prefix)

    async def go():
        return await asyncio.gather(*(engine.generate(GenerationRequest(
            tuple(prompt), SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=s),
            json_schema=schema, reply_prefix=prefix)) for s in seeds))
    return asyncio.run(go())


def test_the_engine_samples_one_path_per_value(engine):
    tok = engine.tokenizer
    outs = generate(engine, MOVE, PREFIX, range(24))
    canonical = {tok.encode(f'{m}"}}', add_special_tokens=False)[0]: m for m in ("rock", "paper", "scissors")}
    seen = set()
    for out in outs:
        assert out.spelled and out.finish_reason == "eos"
        move = json.loads(PREFIX + out.text)["move"]
        assert out.token_ids[:-1] == tok.encode(f'{move}"}}', add_special_tokens=False)  # the end of turn last
        seen.add(canonical[out.token_ids[0]])
    assert len(seen) > 1  # a random model at temperature 1.5: the cut leaves a choice, it does not script one
    counts = generate(engine, COUNT, "", range(12), max_tokens=6)
    for out in counts:
        value = json.loads(out.text)
        assert value in (1, 12, 123) and out.token_ids[:-1] == tok.encode(str(value), add_special_tokens=False)


def test_only_a_reply_whose_masks_were_cut_says_spelled(engine):
    """Free text and numbers keep the grammar's own masks: their completions said spelled=True,
    every constrained reply did, and transcripts recorded a cut that never happened."""
    for schema, prefix in ((FREE, '{"argument": "'), (GUESS, "")):
        assert engine._grammars.spellings(schema, prefix) is None
        assert not any(out.spelled for out in generate(engine, schema, prefix, range(2), max_tokens=6))
    assert all(out.spelled for out in generate(engine, MOVE, PREFIX, range(2)))


def test_replayed_masks_are_the_ones_the_engine_sampled_under(engine):
    """The sampled tokens' logprobs, recomputed from the replayed masks, equal the engine's:
    the replay cuts exactly where the sampler did."""
    model = engine.model
    prompt = engine.apply_chat_template([{"role": "user", "content": "Rock, paper or scissors?"}]) + engine.encode(PREFIX)
    for out in generate(engine, MOVE, PREFIX, range(4), temperature=1.0):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        masks = engine._grammars.replay(MOVE, PREFIX, out.token_ids, range(len(out.token_ids)), spelled=True)
        for i, token in enumerate(out.token_ids):
            keep = torch.tensor(sorted(allowed(masks[i])))
            keep = keep[keep < logits.shape[1]]
            logp = torch.log_softmax(logits[i, keep], -1)[(keep == token).nonzero()[0, 0]]
            assert float(logp) == pytest.approx(out.logprobs[i], abs=1e-4)
