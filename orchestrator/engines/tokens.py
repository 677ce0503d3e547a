"""Tokenizer helpers every backend needs: the chat prompt as ids, and the tokens that end a turn."""
from __future__ import annotations

from typing import Any

from jinja2 import TemplateError

_PLACEHOLDER = "\ue000reply\ue000"  # private-use characters: no template changes them, no chat holds them


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat rendered with the model's template, ending with the assistant's turn header."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers v5 returns a BatchEncoding here, v4 a plain list
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


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
    rest = tokenizer.encode(full[len(head):], add_special_tokens=False)
    return list(previous.prompt_ids) + list(previous.token_ids) + closing + rest


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
