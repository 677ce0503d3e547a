"""A stand-in for the parts of ``vllm`` the vLLM backend touches, for machines without a GPU.

Field and argument names follow vLLM's V1 API (SamplingParams, AsyncEngineArgs, LoRARequest,
AsyncLLM.generate/abort/remove_lora): the dataclasses reject unknown keywords, and values vLLM's
own checks refuse (the newest vLLM's, the strictest: temperature up to 2), so a misspelt field or
a value out of range fails here as it would against the real package. Generation is scripted: each request
yields one final RequestOutput built from ``engine.reply`` (or waits forever when ``hang``).
Under structured outputs the scripted text must be one vLLM could produce: xgrammar (the
backend vLLM picks by default) checks it against the request's grammar or JSON schema, and a
reply outside it fails the request, as a grammar that forbids what the model meant would.
"""
from __future__ import annotations

import asyncio
import enum
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:  # as vLLM's: exactly one constraint
        if sum(x is not None for x in (self.json, self.regex, self.choice, self.grammar)) != 1:
            raise ValueError(f"You can only use one kind of structured outputs constraint: {self}")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:  # vLLM's __post_init__ and _verify_args, for the fields above
        if 0 < self.temperature < 0.01:  # vLLM's _MAX_TEMP: it warns and samples at 0.01
            self.temperature = 0.01
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative or -1, got {self.logprobs}.")
        if any(not s for s in self.stop or ()):
            raise ValueError("stop cannot contain an empty string.")


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:  # as vLLM's
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        assert self.lora_path, "lora_path cannot be empty"


@dataclass
class AsyncEngineArgs:
    model: str
    dtype: str = "auto"
    seed: int = 0
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    enable_prefix_caching: bool | None = None
    logprobs_mode: str = "raw_logprobs"
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    tensor_parallel_size: int = 1


@dataclass
class Reply:
    """What the fake engine answers: tokens with their logprobs, text, and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "stop"
    stop_reason: int | str | None = None
    extra_candidates: bool = True  # also return a runner-up per step, as vLLM may


@dataclass
class Call:
    prompt: dict
    params: SamplingParams
    request_id: str
    lora_request: LoRARequest | None


class AsyncLLMEngine:
    engines: list["AsyncLLMEngine"] = []
    default_reply = Reply([11, 12, 2], [-0.5, -0.25, -0.125], "hi")

    def __init__(self, args: AsyncEngineArgs):
        self.args = args
        self.calls: list[Call] = []
        self.aborted: list[str] = []
        self.removed: list[int] = []
        self.hang = False
        self.reply: Reply | Callable[[Call], Reply] = self.default_reply
        self.shut = False

    @classmethod
    def from_engine_args(cls, args: AsyncEngineArgs) -> "AsyncLLMEngine":
        ranks = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's LoRAConfig checks it as the engine is made
        if args.enable_lora and args.max_lora_rank not in ranks:
            raise ValueError(f"max_lora_rank ({args.max_lora_rank}) must be one of {ranks}.")
        engine = cls(args)
        cls.engines.append(engine)
        return engine

    async def generate(self, prompt: dict, sampling_params: SamplingParams, request_id: str, *,
                       lora_request: LoRARequest | None = None):
        call = Call(prompt, sampling_params, request_id, lora_request)
        self.calls.append(call)
        if self.args.max_model_len is not None and len(prompt["prompt_token_ids"]) > self.args.max_model_len:
            raise ValueError(f"The decoder prompt (length {len(prompt['prompt_token_ids'])}) is longer than the "
                             f"maximum model length of {self.args.max_model_len}.")  # as vLLM's input processor
        while self.hang:
            await asyncio.sleep(0.01)
        reply = self.reply(call) if callable(self.reply) else self.reply
        if sampling_params.structured_outputs is not None:
            check_structured(sampling_params.structured_outputs, reply)
        steps = [{t: Logprob(lp, 1)} | ({t + 1: Logprob(lp - 1.0, 2)} if reply.extra_candidates else {})
                 for t, lp in zip(reply.token_ids, reply.logprobs)]
        out = CompletionOutput(0, reply.text, list(reply.token_ids), sum(reply.logprobs), steps,
                               reply.finish_reason, reply.stop_reason)
        yield RequestOutput(request_id, list(prompt["prompt_token_ids"]), [out], True)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return True

    def shutdown(self) -> None:
        self.shut = True


def check_structured(params: StructuredOutputsParams, reply: Reply) -> None:
    """Raise unless xgrammar allows ``reply.text`` (all of it, once the reply has stopped)."""
    import xgrammar as xgr

    if params.grammar is not None:
        grammar = xgr.Grammar.from_ebnf(params.grammar)
    elif params.json is not None:
        schema = params.json if isinstance(params.json, str) else __import__("json").dumps(params.json)
        grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=not params.disable_any_whitespace)
    else:
        raise NotImplementedError("the fake checks grammar and json structured outputs only")
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1).compile_grammar(grammar)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    if not matcher.accept_string(reply.text) or (reply.finish_reason == "stop" and not matcher.is_terminated()):
        raise ValueError(f"fake vllm: the structured-output grammar does not allow the reply {reply.text!r}")


def install(monkeypatch: Any, *, structured_outputs: bool = True) -> types.ModuleType:
    """Put the fake ``vllm`` (and the submodules the backend imports) into sys.modules."""
    AsyncLLMEngine.engines = []
    root = types.ModuleType("vllm")
    root.__version__ = "0.99.0-fake" if structured_outputs else "0.9.2-fake"
    root.AsyncEngineArgs, root.AsyncLLMEngine, root.SamplingParams = AsyncEngineArgs, AsyncLLMEngine, SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}  # a TypedDict in vLLM
    lora, lora_request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = LoRARequest
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind, sampling.SamplingParams = RequestOutputKind, SamplingParams
    if structured_outputs:  # vLLM < 0.10.2 has GuidedDecodingParams instead
        sampling.StructuredOutputsParams = StructuredOutputsParams
    for name, module in {"vllm": root, "vllm.inputs": inputs, "vllm.lora": lora, "vllm.lora.request": lora_request,
                         "vllm.sampling_params": sampling}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return root
