"""Tokenizer helpers every backend needs: the chat prompt as ids, and the tokens that end a turn."""
from __future__ import annotations

from typing import Any


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat rendered with the model's template, ending with the assistant's turn header."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers v5 returns a BatchEncoding here, v4 a plain list
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def end_of_turn_ids(tokenizer: Any) -> set[int]:
    """EOS plus the chat template's end-of-turn token (``<|im_end|>`` for ChatML models)."""
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return {i for i in ids if i is not None}
