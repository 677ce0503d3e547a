"""``rolecast serve``: an OpenAI-compatible HTTP server over the HF engine (or vLLM: ``--engine vllm``).

Each loaded adapter is a model name, so trained roles can be used by any tool that speaks
``/v1/chat/completions``; the base model is served as ``base`` (and under its own name).
Stdlib only: one request per connection, JSON in and out. A client that closes the
connection before its reply (EOF, as uvicorn takes it too) cancels its generation.

    rolecast serve --model smollm2-135m --adapter judge=runs/x/sampler/judge --port 8000
"""
from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from urllib.parse import unquote
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import structlog

from .engines.base import GenerationRequest, RequestRefused, SamplingParams
from .engines.hf import HFEngine
from .grammar.schema import GrammarError
from .messages import check_schema, schema_json

if TYPE_CHECKING:
    from .engines.vllm import VLLMEngine

log = structlog.get_logger()
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # cancelled and error are no reply: a 500
MAX_BODY = 4 * 1024 * 1024
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_STOP = 16  # OpenAI's is 4; vLLM sets none
UNHONOURED = ("tools", "functions", "logit_bias", "presence_penalty", "frequency_penalty")  # refused, not ignored
# OpenAI's bookkeeping (who asked, billing, caching), which changes no reply: accepted and ignored.
# parallel_tool_calls shapes only tool calls, which are refused.
IGNORED = ("user", "safety_identifier", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention",
           "parallel_tool_calls")
KNOWN = frozenset(("model", "messages", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed",
                   "logprobs", "top_logprobs", "response_format", "n", "stream", *UNHONOURED, *IGNORED))
LINGER_S = 5.0  # how long an error reply waits for the rest of a request it did not read
READ_TIMEOUT_S = 30.0  # how long a client may take to send its request (a 408 past it)


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape, every key present: its clients read ``code`` and ``param`` off each error."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class ClientGone(Exception):
    """The client closed its side of the connection before the reply."""


class ChatServer:
    def __init__(self, engine: HFEngine | VLLMEngine, model_name: str, request_timeout_s: float = 300.0,
                 read_timeout_s: float = READ_TIMEOUT_S):
        self.engine = engine
        self.model_name = model_name
        self.timeout, self.read_timeout = request_timeout_s, read_timeout_s
        self.started = int(time.time())  # each model's "created", which OpenAI's Model requires
        self.handlers: set[asyncio.Task] = set()  # connections being answered: serve cancels them at shutdown

    def models(self) -> list[str]:
        return ["base", self.model_name, *sorted(self.engine.versions)]

    def model(self, name: str) -> dict[str, Any]:
        """OpenAI's Model object, or its 404."""
        if name not in self.models():
            raise HTTPError(404, f"model {name!r} not found; available: {', '.join(self.models())}",
                            code="model_not_found")  # OpenAI's type and code, which its clients check
        return {"id": name, "object": "model", "created": self.started, "owned_by": "rolecast"}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handlers.add(task := asyncio.current_task())
        try:
            await self._answer(reader, writer)
        except asyncio.CancelledError:  # shutdown: Python 3.11's start_server prints a traceback per handler cancelled
            writer.close()
        finally:
            self.handlers.discard(task)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        unread = True  # refused before its end was read: a body too large, a chunked one
        try:
            method, path, body = await self._read(reader, writer)
            unread = False
            status, payload = 200, await _unless_gone(reader, self.route(method, path, body))
        except (ClientGone, ConnectionError):  # a reset too (a TCP health check, a killed client)
            log.info("serve.client_gone", note="generation cancelled: the client closed the connection")
            writer.close()
            return
        except HTTPError as exc:
            status, payload = exc.status, exc.body()
        except Exception as exc:  # a bug must not take the server down
            log.error("serve.error", error=f"{type(exc).__name__}: {exc}")
            status, payload = 500, HTTPError(500, f"{type(exc).__name__}: {exc}", "server_error").body()
        data = json.dumps(payload).encode()
        head = f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\nContent-Type: application/json\r\n"
        writer.write(head.encode() + f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        try:
            await writer.drain()
            if unread:
                await _linger(reader, writer)
        except ConnectionError:  # reset before its reply was out: nobody left to tell
            pass
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, str, bytes]:
        try:
            return await asyncio.wait_for(_read_request(reader, writer), self.read_timeout)
        except asyncio.TimeoutError:
            raise HTTPError(408, f"the request was not sent within the server's read timeout ({self.read_timeout:g} s)",
                            "timeout") from None

    async def route(self, method: str, path: str, body: bytes) -> dict[str, Any]:
        path = path.split("?")[0].rstrip("/")
        if method == "GET" and path == "/v1/models":
            return {"object": "list", "data": [self.model(m) for m in self.models()]}
        if method == "GET" and path.startswith("/v1/models/"):  # openai-python's models.retrieve
            return self.model(unquote(path.removeprefix("/v1/models/")))  # a hub id or a path holds "/"
        if method == "POST" and path == "/v1/chat/completions":
            return await self.chat(_json(body))
        raise HTTPError(404, f"no route for {method} {path}", code="unknown_url")  # OpenAI's type and code

    async def chat(self, req: dict[str, Any]) -> dict[str, Any]:
        model = req.get("model")
        if not isinstance(model, str):  # no name at all is the request's fault (400, as OpenAI), not a 404
            raise HTTPError(400, f"model must be the name of one of: {', '.join(self.models())}; got {model!r}")
        self.model(model)  # a 404 for a model not served
        messages = _messages(req.get("messages"))
        given = {k: v for k, v in req.items() if v is not None}  # OpenAI's API reads null as "the default"
        if unknown := sorted(set(given) - KNOWN):  # vLLM's top_k, min_p...: answered as if absent, they were
            raise HTTPError(400, f"Unrecognized request argument{'s' * (len(unknown) > 1)} supplied: {', '.join(unknown)}",
                            param=unknown[0])  # OpenAI's words
        if _whole("n", given.get("n", 1)) != 1:  # a bool is an int: n = true was taken as 1
            raise HTTPError(400, "only n = 1 is supported")
        if _flag("stream", given.get("stream", False)):
            raise HTTPError(400, "stream is not supported: ask without it for one JSON reply")
        # their defaults are no ask; false is no default (False == 0: presence_penalty false passed as 0)
        if asked := [k for k in UNHONOURED if isinstance(given.get(k), bool) or given.get(k, 0) not in (0, [], {})]:
            raise HTTPError(400, f"{asked[0]} is not supported: the engine samples without it, so ask without it")
        stop = given.get("stop", [])
        if isinstance(stop, str):
            stop = [stop]
        if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            raise HTTPError(400, f"stop must be a string or a list of strings, got {stop!r}")
        if len(stop) > MAX_STOP:  # each is looked for after every token: 250,000 slowed a neighbour 5x
            raise HTTPError(400, f"stop: at most {MAX_STOP} strings, got {len(stop)}")
        logprobs = _flag("logprobs", given.get("logprobs", False))
        top = given.get("top_logprobs", 0)
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise HTTPError(400, f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}, got {top!r}")
        if top and not logprobs:
            raise HTTPError(400, "top_logprobs needs logprobs: true")
        try:
            prompt = self.engine.apply_chat_template(messages)
        except jinja2.TemplateError as exc:  # the template's own raise_exception: no system role, roles that must alternate
            raise HTTPError(400, f"the model's chat template refuses these messages: {exc}") from None
        limit = getattr(self.engine, "context_length", None)
        if limit is not None and len(prompt) >= limit:  # said so, not as a max_tokens the client never sent
            raise HTTPError(400, f"the prompt ({len(prompt)} tokens) leaves no room for a reply in the model's "
                                 f"context of {limit} tokens", code="context_length_exceeded")
        if "max_tokens" in given and "max_completion_tokens" in given:  # max_completion_tokens was ignored
            raise HTTPError(400, "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported.",
                            code="invalid_parameter_combination", param="max_tokens")  # OpenAI's words
        max_name = "max_tokens" if "max_tokens" in given else "max_completion_tokens"
        if max_name in given:
            max_tokens = _whole(max_name, given[max_name])
        else:  # unasked: 256, or the room the prompt leaves (a 400 about a max_tokens never sent)
            max_tokens = 256 if limit is None else min(256, limit - len(prompt))
        try:
            sampling = SamplingParams(
                temperature=_number("temperature", given.get("temperature", 1.0)),
                top_p=_number("top_p", given.get("top_p", 1.0)), max_tokens=max_tokens, stop=tuple(stop),
                seed=None if given.get("seed") is None else _whole("seed", given["seed"]), top_logprobs=top,
            )
        except (TypeError, ValueError) as exc:
            raise HTTPError(400, f"bad sampling parameter: {exc}") from None
        schema = response_schema(req.get("response_format"))
        if limit is not None and len(prompt) + sampling.max_tokens > limit:
            raise HTTPError(400, f"the prompt ({len(prompt)} tokens) and max_tokens ({sampling.max_tokens}) exceed "
                                 f"the model's context of {limit} tokens", code="context_length_exceeded")
        adapter = None if model in ("base", self.model_name) else model
        request = GenerationRequest(tuple(prompt), sampling, adapter, json_schema=schema)
        try:
            out = await asyncio.wait_for(self.engine.generate(request), self.timeout)
        except TimeoutError:  # the server's own slowness: 408 says the client was slow to send
            raise HTTPError(504, f"no reply within the server's request timeout ({self.timeout:g} s)", "timeout") from None
        except GrammarError as exc:  # a valid schema the grammar compiler cannot take
            raise HTTPError(400, f"response_format: {exc}") from None
        except RequestRefused as exc:  # vLLM's own checks (temperature, its context); any other error is a 500
            raise HTTPError(400, f"the engine refused the request: {exc}") from None
        if out.finish_reason not in FINISH:  # vLLM aborted or failed it: its text is cut short, no reply that stopped
            raise RuntimeError(f"the engine ended the generation as {out.finish_reason!r} after {len(out.token_ids)} tokens")
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": out.text},
                                  "finish_reason": FINISH[out.finish_reason]}
        if logprobs:
            tok = self.engine.tokenizer
            tops = out.top_logprobs or [[] for _ in out.token_ids]
            choice["logprobs"] = {"content": [
                {"token": tok.decode([t]), "logprob": lp,
                 "top_logprobs": [{"token": tok.decode([a]), "logprob": alp} for a, alp in alternatives]}
                for t, lp, alternatives in zip(out.token_ids, out.logprobs, tops)]}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out.token_ids),
                      "total_tokens": len(prompt) + len(out.token_ids)},
            "system_fingerprint": f"rolecast-{adapter or 'base'}-v{out.adapter_version}",
        }


def _messages(messages: Any) -> list[dict[str, Any]]:
    """The chat with each content as one string: a list of text parts (OpenAI's other spelling, which
    LangChain and others send) is joined with newlines, as vLLM joins them. Other parts are refused."""
    shape = "messages must be a non-empty list of {role, content}, each content a string or a list of text parts"
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, shape)
    chat = []
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            raise HTTPError(400, shape, param=f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list) and content and all(isinstance(p, dict) for p in content):
            if kinds := sorted({str(p.get("type")) for p in content} - {"text"}):
                raise HTTPError(400, f"messages[{i}]: content parts of type {', '.join(kinds)} are not supported: "
                                     "the served model reads text parts only", param=f"messages[{i}].content")
            if not all(isinstance(p.get("text"), str) for p in content):
                raise HTTPError(400, f"messages[{i}]: a text part's text must be a string", param=f"messages[{i}].content")
            content = "\n".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise HTTPError(400, shape, param=f"messages[{i}].content")
        chat.append({**m, "content": content})
    return chat


def _number(name: str, value: Any) -> float:
    """A JSON number (not a bool, a string or NaN); an integer past float's range is the infinity
    that 1e400 reads as, for the range checks to refuse (float() raised OverflowError: a 500)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise HTTPError(400, f"{name}: expected a number, got {value!r}", param=name)
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _whole(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HTTPError(400, f"{name}: expected a whole number, got {value!r}", param=name)
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):  # logprobs "false" (truthy) was answered with logprobs, stream 0 without a word
        raise HTTPError(400, f"{name} must be true or false, got {value!r}", param=name)
    return value


def response_schema(fmt: Any) -> str | None:
    """The JSON schema text an OpenAI ``response_format`` asks for (None: free text).

    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` forwards the schema to
    the engine, which constrains decoding to it where it can; ``json_object`` is any JSON object.
    """
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_json({"type": "object"})
    if kind != "json_schema":
        raise HTTPError(400, f"response_format type {kind!r} is not supported: use text, json_object or json_schema")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise HTTPError(400, "response_format.json_schema.schema must be a JSON object (the JSON Schema)")
    if problem := check_schema(schema):
        raise HTTPError(400, f"response_format.json_schema.schema: {problem}")
    return schema_json(schema)


async def _unless_gone(reader: asyncio.StreamReader, work: Any) -> Any:
    """``work``'s result, or ClientGone (``work`` cancelled) if the client closes first: with
    nobody left to read the reply, its tokens would be wasted work for the requests still waiting."""
    task = asyncio.ensure_future(work)
    eof = asyncio.ensure_future(reader.read(1))
    try:
        done, _ = await asyncio.wait({task, eof}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done and (eof.exception() is not None or eof.result() == b""):  # EOF, or a reset
            task.cancel()
            raise ClientGone
        return await task  # a byte after the request is not read: one request per connection
    finally:
        eof.cancel()
        task.cancel()  # a no-op once it is done; else the handler itself was cancelled (shutdown)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Drop what the client still sends until it closes, for LINGER_S at most (nginx's lingering
    close): a socket closed with input unread is reset, and a client still sending its body saw
    'Broken pipe', never the error reply."""
    writer.write_eof()

    async def drop() -> None:
        while await reader.read(65536):
            pass

    try:
        await asyncio.wait_for(drop(), LINGER_S)
    except asyncio.TimeoutError:
        pass


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, str, bytes]:
    parts = (await _read_line(reader)).split()
    if len(parts) != 3:
        raise HTTPError(400, "malformed request line")
    length, expect = 0, False
    while (header := await _read_line(reader)):
        name, _, value = header.partition(":")
        # curl asks before a body past 1 KB (older curls) or 1 MB, then waits a second for the go-ahead
        expect |= name.strip().lower() == "expect" and value.strip().lower() == "100-continue"
        if name.strip().lower() == "content-length":
            if not value.strip().isdecimal():  # not isdigit: int() refuses "²"
                raise HTTPError(400, f"bad Content-Length: {value.strip()!r}")
            digits = value.strip().lstrip("0") or "0"  # int() refuses past 4300 digits: a ValueError, a 500
            length = int(digits) if len(digits) <= len(str(MAX_BODY)) else MAX_BODY + 1
        if name.strip().lower() == "transfer-encoding":
            raise HTTPError(411, "a chunked body is not read here: send the body with a Content-Length")
    if length > MAX_BODY:
        raise HTTPError(413, "request body too large")
    if expect and length:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    try:
        return parts[0], parts[1], await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError as exc:
        raise HTTPError(400, f"the body ended after {len(exc.partial)} of its {length} bytes (Content-Length)") from None


async def _read_line(reader: asyncio.StreamReader) -> str:
    try:
        return (await reader.readline()).decode("latin-1").strip()
    except ValueError:  # past the reader's limit (a long query string, a big cookie): the client's fault, not a 500
        raise HTTPError(400, "a request line or header is longer than 64 KiB") from None


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except ValueError as exc:
        raise HTTPError(400, f"body is not JSON: {exc}") from None
    except RecursionError:
        raise HTTPError(400, "body is nested too deeply") from None
    if not isinstance(data, dict):
        raise HTTPError(400, "body must be a JSON object")
    try:  # JSON may escape half a surrogate pair, which no tokenizer takes
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise HTTPError(400, "body holds half a UTF-16 surrogate pair (\\ud800-\\udfff alone): not text") from None
    return data


def base_url(host: str, port: int) -> str:
    """The API's URL; an IPv6 address goes in brackets ("http://::1:8000/v1" is no URL)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


async def serve(engine: HFEngine | VLLMEngine, model_name: str, host: str, port: int, adapters: dict[str, Path], ready=None) -> None:
    """Serve ``engine``, which holds ``adapters`` (loaded with it), until cancelled; then close it."""
    chat = ChatServer(engine, model_name)
    try:
        server = await asyncio.start_server(chat.handle, host, port)
        bound = server.sockets[0].getsockname()[1]
        log.info("serve.listening", url=base_url(host, bound), models=["base", *sorted(adapters)])
        if ready is not None:
            ready(bound)
        async with server:
            await server.serve_forever()
    finally:
        for task in list(chat.handlers):  # their generations cancelled, not failed by the closing engine
            task.cancel()
        await engine.aclose()  # a scheduler step still running as the process exits aborts it
