"""The model engine as a policy: render the chat, generate, keep tokens and sampling logprobs."""
from __future__ import annotations

from jinja2 import TemplateError

from ..engines.base import Engine, GenerationRequest, RequestRefused, SamplingParams
from ..engines.tokens import continuation_ids
from .base import PolicyOutput, PolicyRequest


class EnginePolicy:
    def __init__(self, engine: Engine):
        self.engine = engine

    async def __call__(self, request: PolicyRequest) -> PolicyOutput:
        try:
            prompt_ids = self._prompt_ids(request)
        except TemplateError as exc:  # the template's raise_exception: Gemma's has no system role
            hint = ' (system: "" sends none)' if request.messages[0]["role"] == "system" else ""
            raise RequestRefused(f"role {request.role!r}, turn {request.turn}: the model's chat template refuses "
                                 f"its messages: {exc}{hint}") from None
        if request.reply_prefix:  # the reply starts with it: prompt-side tokens, never sampled
            prompt_ids = prompt_ids + self.engine.encode(request.reply_prefix)
        s = request.sampling
        generation = GenerationRequest(
            prompt_ids=tuple(prompt_ids),
            sampling=SamplingParams(
                temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, stop=tuple(s.stop), seed=request.seed
            ),
            adapter=request.adapter,
            json_schema=request.json_schema,
            reply_prefix=request.reply_prefix if request.json_schema else "",
        )
        try:
            completion = await self.engine.generate(generation)
        except RequestRefused as exc:  # a conversation grown past the context, say: the episode's error says whose
            raise RequestRefused(f"role {request.role!r}, turn {request.turn}: {exc}") from None
        return PolicyOutput(
            text=request.reply_prefix + completion.text,
            prompt_ids=list(prompt_ids),
            token_ids=list(completion.token_ids),
            logprobs=list(completion.logprobs),
            finish_reason=completion.finish_reason,
            adapter=completion.adapter,
            adapter_version=completion.adapter_version,
            json_schema=request.json_schema,
            forced_tokens=completion.forced_tokens,
            spelled=completion.spelled,
        )

    def _prompt_ids(self, request: PolicyRequest) -> list[int]:
        tokenizer = getattr(self.engine, "tokenizer", None)
        previous = request.extends
        if tokenizer is not None and previous is not None and previous.prompt_ids:
            ids = continuation_ids(tokenizer, request.messages, previous)
            if ids is not None:
                return ids
        return self.engine.apply_chat_template(request.messages)
