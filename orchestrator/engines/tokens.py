"""Tokenizer helpers every backend needs: the chat prompt as ids, and the tokens that end a turn."""
from __future__ import annotations

import functools
import re
from typing import Any

import structlog
from jinja2 import TemplateError

log = structlog.get_logger()
_PLACEHOLDER = "\ue000reply\ue000"  # private-use characters: no template changes them, no chat holds them
_MARK = "\ue001"  # around a message's index, in its place, to find where the template writes each text


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat rendered with the model's template, ending with the assistant's turn header.

    A message's text is read as text: where it spells a special token (``<|im_end|>`` in a file
    a role quotes, or written by another role), that stays plain text, never a turn's end or
    another role's header. The template's own special tokens are read as they are.
    """
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return _encode(tokenizer, _segments(tokenizer, messages, rendered, add_generation_prompt=True))


@functools.lru_cache(maxsize=8)
def _specials(tokenizer: Any) -> re.Pattern[str] | None:
    texts = sorted((t.content for t in tokenizer.added_tokens_decoder.values() if t.special), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, texts))) if texts else None


def _spells_special(tokenizer: Any, text: str) -> bool:
    pattern = _specials(tokenizer)
    return pattern is not None and pattern.search(text) is not None


def _segments(tokenizer: Any, messages: list[dict[str, str]], rendered: str,
              add_generation_prompt: bool) -> list[tuple[str, bool]]:
    """``rendered``, the chat's rendering, as (text, literal) pieces that join to it: literal
    ones are messages' texts that spell a special token, to be encoded as plain text."""
    if not any(_spells_special(tokenizer, m["content"]) for m in messages):
        return [(rendered, False)]
    marked = [dict(m, content=f"{_MARK}{i}{_MARK}") for i, m in enumerate(messages)]
    skeleton = tokenizer.apply_chat_template(marked, add_generation_prompt=add_generation_prompt, tokenize=False)
    parts = re.split(f"{_MARK}(\\d+){_MARK}", skeleton)
    for written in (str, str.strip):  # how the template writes a text: as it is, or trimmed (Llama 3's, Gemma's)
        pieces: list[tuple[str, bool]] = []
        for n, part in enumerate(parts):
            text = written(messages[int(part)]["content"]) if n % 2 else part
            literal = bool(n % 2) and _spells_special(tokenizer, text)
            if pieces and not literal and not pieces[-1][1]:
                pieces[-1] = (pieces[-1][0] + text, False)
            else:
                pieces.append((text, literal))
        if "".join(text for text, _ in pieces) == rendered:
            return pieces
    # the template rewrites texts otherwise: where each lies in the rendering is unknown
    log.warning("tokens.special_text_read_as_tokens",
                reason="the chat template rewrites message texts, so a special token spelled in one is read as one")
    return [(rendered, False)]


def _encode(tokenizer: Any, pieces: list[tuple[str, bool]]) -> list[int]:
    return [i for text, literal in pieces
            for i in tokenizer.encode(text, add_special_tokens=False, split_special_tokens=literal)]


def continuation_ids(tokenizer: Any, messages: list[dict[str, str]], previous: Any) -> list[int] | None:
    """Prompt ids for ``messages`` that continue ``previous`` (an Attempt) token for token.

    ``messages`` must be ``previous.messages``, then ``previous.text`` as the assistant's reply,
    then more. The result is ``previous.prompt_ids + previous.token_ids`` (the reply as it was
    sampled, not re-tokenised from its text) followed by what the chat template writes after
    the reply and for the new messages. So the model reads exactly what it wrote, and training
    merges the two attempts into one sequence. None when that cannot be done safely: another
    shape, a template that changes the reply's text or writes it after another header than the
    generation prompt, or a reply cut by a stop string (its text ends before its tokens do).
    """
    k = len(previous.messages)
    if (len(messages) <= k + 1 or messages[:k] != previous.messages or not previous.token_ids
            or messages[k] != {"role": "assistant", "content": previous.text}):
        return None
    head = tokenizer.apply_chat_template(messages[: k + 1], add_generation_prompt=False, tokenize=False)
    full = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # Where the template writes the reply, from a placeholder in its place: searched for in the chat,
    # an empty reply was found in the closing, one the template trims in an earlier message.
    placeholder = {"role": "assistant", "content": _PLACEHOLDER}
    before, found, after = tokenizer.apply_chat_template(messages[:k] + [placeholder], add_generation_prompt=False,
                                                         tokenize=False).partition(_PLACEHOLDER)
    # and the prompt the reply was sampled after must be what the template writes before it (not so
    # where the generation prompt opens a <think> that earlier replies are written without)
    prompt = tokenizer.apply_chat_template(messages[:k], add_generation_prompt=True, tokenize=False)
    if not found or before != prompt or head != before + previous.text + after or not full.startswith(head):
        return None
    closing = tokenizer.encode(after, add_special_tokens=False)  # e.g. <|im_end|> \n
    if previous.finish_reason == "eos":  # the sampled end of turn is the template's closing token
        if not closing or closing[0] != previous.token_ids[-1]:
            return None
        closing = closing[1:]
    elif previous.finish_reason != "length":
        return None
    rest = _encode(tokenizer, _after(_segments(tokenizer, messages, full, add_generation_prompt=True), len(head)))
    return list(previous.prompt_ids) + list(previous.token_ids) + closing + rest


def _after(pieces: list[tuple[str, bool]], start: int) -> list[tuple[str, bool]]:
    """``pieces`` from character ``start`` of the text they join to."""
    kept = []
    for text, literal in pieces:
        if start < len(text):
            kept.append((text[max(start, 0):], literal))
        start -= len(text)
    return kept


def end_of_turn_ids(tokenizer: Any) -> set[int]:
    """EOS plus the chat template's end-of-turn token, where that is another one."""
    ids = {tokenizer.eos_token_id, turn_end_id(tokenizer)}
    return {i for i in ids if i is not None}


def turn_end_id(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after a reply: ``<|im_end|>`` for ChatML,
    ``<|eot_id|>`` for Llama 3, ``<end_of_turn>`` for Gemma (whose EOS is ``<eos>``). None where
    the template closes a reply with text, or with nothing, or refuses a chat without a system message."""
    chat = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": _PLACEHOLDER}]
    try:
        rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    except TemplateError:
        return None
    after = rendered.partition(_PLACEHOLDER)[2]
    closing = tokenizer.encode(after, add_special_tokens=False)
    token = tokenizer.added_tokens_decoder.get(closing[0]) if closing else None
    return closing[0] if token is not None and token.special else None


class TokenizerMethods:
    """The Engine protocol's tokenizer half, for an engine with a Hugging Face ``tokenizer``."""

    tokenizer: Any

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, messages)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
