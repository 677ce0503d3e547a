"""`rolecast serve` on loopback, and the OpenAI-compatible client policy against it."""
from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orchestrator.policies.binding import Binding
from orchestrator.rollout import RunOptions, build_policies, run_team
from orchestrator.team import load_team
from support import lora_state, peft_dir

ROOT = Path(__file__).resolve().parents[2]


def tiny_adapter(folder: Path) -> Path:
    """A random PEFT-format LoRA for the tiny model's q/v projections."""
    from orchestrator.models import load_model

    return peft_dir(folder, lora_state(load_model("tiny").model, 5, modules=("q_proj", "v_proj")))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    adapter = tiny_adapter(tmp_path_factory.mktemp("ad") / "judge")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", "--model", "tiny", "--dtype", "float32",
                             "--port", "0", "--adapter", f"judge={adapter}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), proc.stderr.read()
    yield line.split()[-1]
    proc.terminate()
    proc.wait(timeout=30)


def call(url: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, json.dumps(body).encode() if body is not None else None,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 8, "temperature": 0.0, **extra}


def test_models_lists_base_and_adapters(server):
    status, data = call(server, "/models")
    assert status == 200 and {m["id"] for m in data["data"]} >= {"base", "tiny", "judge"}
    # OpenAI's Model has all four: without created, openai-python's Model.created (an int) was None
    assert all(set(m) == {"id", "object", "created", "owned_by"} and isinstance(m["created"], int) for m in data["data"])


def test_chat_completion_shape_and_logprobs(server):
    status, data = call(server, "/chat/completions", chat("base", logprobs=True))
    assert status == 200, data
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    assert data["usage"]["completion_tokens"] == len(choice["logprobs"]["content"]) > 0
    assert all(t["logprob"] <= 0 for t in choice["logprobs"]["content"])


def test_top_logprobs_are_each_tokens_most_likely_alternatives(server):
    """As OpenAI's chat completions: logprobs.content[].top_logprobs, the N most likely tokens with
    their logprobs, most likely first (the chosen one first under greedy decoding); [] unasked."""
    status, data = call(server, "/chat/completions", chat("judge", logprobs=True, top_logprobs=3))
    assert status == 200, data
    content = data["choices"][0]["logprobs"]["content"]
    assert len(content) == data["usage"]["completion_tokens"] > 0
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == 3 and top[0] == {"token": entry["token"], "logprob": entry["logprob"]}
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True) and top[-1]["logprob"] < 0
    plain = call(server, "/chat/completions", chat("judge", logprobs=True))[1]["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in plain] == [e["token"] for e in content]  # the logprobs within batching's rounding
    assert [e["logprob"] for e in plain] == pytest.approx([e["logprob"] for e in content], abs=1e-4)
    assert all(e["top_logprobs"] == [] for e in plain)


def test_each_adapter_is_a_model(server):
    base = call(server, "/chat/completions", chat("base"))[1]
    judge = call(server, "/chat/completions", chat("judge"))[1]
    assert judge["system_fingerprint"] == "rolecast-judge-v1"
    assert judge["choices"][0]["message"]["content"] != base["choices"][0]["message"]["content"]


def test_errors_are_json(server):
    status, data = call(server, "/chat/completions", chat("nope"))
    assert status == 404 and "not found" in data["error"]["message"]
    # OpenAI's shape for an unknown model: it was type "not_found" with no code, which clients checking it missed
    assert (data["error"]["type"], data["error"]["code"]) == ("invalid_request_error", "model_not_found"), data
    status, data = call(server, "/chat/completions", {"model": "base", "messages": "hi"})
    assert status == 400 and "messages" in data["error"]["message"]
    status, data = call(server, "/nowhere", {})
    assert status == 404
    # half a surrogate pair (a string cut between UTF-16 units) is no text: the tokenizer's TypeError was a 500
    status, data = call(server, "/chat/completions", chat("base", messages=[{"role": "user", "content": "cut \ud83d"}]))
    assert status == 400 and "surrogate" in data["error"]["message"], data


def exchange(server, sent: bytes) -> tuple[int, dict]:
    """The status and JSON body ``server`` (a ChatServer) answers to ``sent``, sent on one connection."""
    import socket

    def talk(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(sent)
            return b"".join(iter(lambda: conn.recv(65536), b""))

    async def go():
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        async with listening:
            return await asyncio.to_thread(talk, listening.sockets[0].getsockname()[1])

    head, _, body = asyncio.run(go()).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


class BrokenEngine:
    versions: dict = {}

    def apply_chat_template(self, messages):
        raise RuntimeError("a bug")


@pytest.mark.parametrize("sent, status, kind, code", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{", 408, "timeout", None),  # never ends
    (b"GET /v1/nowhere HTTP/1.1\r\n\r\n", 404, "invalid_request_error", "unknown_url"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (
        len(json.dumps(chat("base"))), json.dumps(chat("base")).encode()), 500, "server_error", None),
], ids=["read-timeout", "unknown-route", "server-bug"])
def test_every_error_is_in_openais_shape(sent, status, kind, code):
    """The 408 and 500 bodies had no code (nor any error a param), and an unknown route's type was
    not_found, not OpenAI's invalid_request_error with code unknown_url; the read timeout, a literal
    30 s, had no test."""
    from orchestrator.serve import ChatServer

    reply_status, reply = exchange(ChatServer(BrokenEngine(), "tiny", read_timeout_s=0.2), sent)
    assert reply_status == status and set(reply["error"]) == {"message", "type", "param", "code"}, reply
    assert (reply["error"]["type"], reply["error"]["code"]) == (kind, code) and reply["error"]["message"]
    if status == 408:
        assert "read timeout (0.2 s)" in reply["error"]["message"]


@pytest.mark.parametrize("body", [{}, {"model": None}, {"model": ["base"]}], ids=["missing", "null", "a-list"])
def test_a_request_without_a_model_name_is_a_400(body):
    """It was a 404 "model None not found" (OpenAI's SDK raises NotFoundError): OpenAI answers a
    request that names no model with a 400."""
    from orchestrator.serve import ChatServer, HTTPError

    class NoEngine:
        versions: dict = {}

    with pytest.raises(HTTPError, match="model must be the name of one of: base, tiny") as caught:
        asyncio.run(ChatServer(NoEngine(), "tiny").chat({**body, "messages": [{"role": "user", "content": "hi"}]}))
    assert caught.value.status == 400


class RecordingEngine:
    """Answers every request with two tokens, finished as ``reason``, and keeps the requests."""

    versions: dict = {}

    def __init__(self, reason: str = "eos", context_length: int | None = None):
        self.requests, self.reason, self.context_length = [], reason, context_length

    def apply_chat_template(self, messages):
        return [1, 2, 3]

    async def generate(self, request):
        from orchestrator.engines.base import Completion

        self.requests.append(request)
        return Completion([7, 8], "hi", [-0.1, -0.2], self.reason)


def test_each_sampling_option_reaches_the_engine_as_asked():
    """Mutants that dropped top_p, seed or stop from the engine's request, refused a lone stop
    string, ignored max_completion_tokens, served the model's own name as an adapter, or said a
    constant total_tokens passed every test."""
    from orchestrator.engines.base import SamplingParams
    from orchestrator.serve import ChatServer

    engine = RecordingEngine()
    body = chat("tiny", temperature=0.7, top_p=0.9, seed=5, stop="END", max_tokens=None, max_completion_tokens=3)
    reply = asyncio.run(ChatServer(engine, "tiny").chat(body))
    [request] = engine.requests
    assert request.sampling == SamplingParams(temperature=0.7, top_p=0.9, max_tokens=3, stop=("END",), seed=5)
    assert request.adapter is None and request.prompt_ids == (1, 2, 3)  # "tiny" is the base model
    assert reply["model"] == "tiny" and reply["choices"][0]["message"]["content"] == "hi"
    assert reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert reply["system_fingerprint"] == "rolecast-base-v0"  # the adapter and version that answered


def test_each_reply_has_its_own_id_and_the_time_it_was_made():
    """As OpenAI's: a reply's created is when it was made, a model's the server's start (Unix seconds).
    Mutants answering every reply with one id, 0 (1970) for either created, or a choice without its
    index (openai-python's Choice.index), passed every test."""
    from orchestrator.serve import ChatServer

    before = int(time.time())
    server = ChatServer(RecordingEngine(), "tiny")
    first, second = (asyncio.run(server.chat(chat("base"))) for _ in range(2))
    after = time.time()
    assert first["id"] != second["id"] and all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", r["id"]) for r in (first, second))
    assert before <= first["created"] <= after and before <= server.model("base")["created"] <= after
    assert first["choices"][0]["index"] == 0


@pytest.mark.parametrize("reason, finish", [("eos", "stop"), ("stop", "stop"), ("length", "length")])
def test_finish_reason_is_openais(reason, finish):
    """An end token and a stop string both finish as OpenAI's "stop"; max_tokens as "length"."""
    from orchestrator.serve import ChatServer

    reply = asyncio.run(ChatServer(RecordingEngine(reason), "tiny").chat(chat("base")))
    assert reply["choices"][0]["finish_reason"] == finish


@pytest.mark.parametrize("reason", ["cancelled", "error"])
def test_a_generation_the_engine_aborted_is_a_500_not_a_reply(reason):
    """vLLM's abort and error finishes were a 200 with finish_reason "stop": text cut short, said to be whole."""
    from orchestrator.serve import ChatServer

    body, server = json.dumps(chat("base")).encode(), ChatServer(RecordingEngine(reason), "tiny")
    status, reply = exchange(server, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    assert (status, reply["error"]["type"]) == (500, "server_error"), reply
    assert not server.handlers  # an answered connection's task is let go: a mutant keeping each grew the server for ever
    assert f"the engine ended the generation as '{reason}' after 2 tokens" in reply["error"]["message"]


def test_response_format_json_schema_is_accepted_and_checked(server):
    schema = {"type": "object", "properties": {"winner": {"type": "string"}}, "required": ["winner"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "judge", "schema": schema, "strict": True}}
    status, data = call(server, "/chat/completions", chat("judge", response_format=fmt))
    assert status == 200 and data["choices"][0]["finish_reason"] in ("stop", "length"), data
    bad = {"type": "json_schema", "json_schema": {"name": "judge", "schema": {"type": "objekt"}}}
    status, data = call(server, "/chat/completions", chat("judge", response_format=bad))
    assert status == 400 and "invalid JSON Schema" in data["error"]["message"]


def test_openai_policy_plays_a_role_against_rolecast_serve(server, tmp_path):
    team = load_team(ROOT / "recipes" / "debate.yaml")
    bindings = {name: Binding("builtin", "stub") for name in ("pro", "con")}
    bindings["judge"] = Binding("openai", f"judge@{server}")
    policies = build_policies(team, bindings, lambda: None)
    result = asyncio.run(run_team(team, policies, RunOptions(episodes=2, seed=0, out_dir=tmp_path, progress=False)))
    assert [e.status for e in result.episodes] == ["ok", "ok"]
    judge_turns = [t for e in result.episodes for t in e.turns if t.role == "judge"]
    assert judge_turns and all(a.text for t in judge_turns for a in t.attempts)


def test_openai_binding_is_checked():
    from orchestrator.policies.binding import parse_binding
    from orchestrator.registry import default_registry

    for target in ("judge", "judge@http://", "judge@http:///v1"):  # no host: it had failed every episode
        with pytest.raises(ValueError, match="MODEL@http"):
            parse_binding(f"openai:{target}").check(default_registry())
    with pytest.raises(ValueError, match="its port is no number"):
        parse_binding("openai:judge@http://host:80a/v1").check(default_registry())
    parse_binding("openai:judge@http://[::1]:8000/v1").check(default_registry())


@pytest.mark.parametrize("extra, words", [
    ({"stop": [1]}, "stop must be a string or a list of strings"),
    ({"stop": 5}, "stop must be a string or a list of strings"),
    ({"stop": {"a": 1}}, "stop must be a string or a list of strings"),
    ({"stop": [str(i) for i in range(17)]}, "stop: at most 16 strings, got 17"),
    ({"temperature": -1}, "temperature must be 0 (greedy) or a number >= 0.001"),
    ({"temperature": 1e-300}, "temperature must be 0 (greedy) or a number >= 0.001"),  # logits / T overflows
    ({"temperature": 1e39, "response_format": {"type": "json_object"}},  # inf in float32: a 400 blaming the schema
     "temperature must be 0 (greedy) or a number >= 0.001"),
    ({"temperature": "hot"}, "expected a number"),
    ({"top_p": 0}, "top_p must be in [1e-06, 1]"),
    ({"top_p": 1e-50}, "top_p must be in [1e-06, 1]"),  # 0 in float32
    ({"seed": 2**64}, "seed must be a whole number from 0 to 2**63 - 1"),  # it failed the whole batch, a 500 each
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["a"]}}}},
     "response_format: "),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": functools.reduce(
        lambda inner, _: {"type": "object", "properties": {"a": inner}}, range(200), {"type": "string"})}}},
     "invalid JSON Schema: nested too deeply"),  # a RecursionError, a 500
    ({"max_tokens": 0}, "max_tokens must be a whole number >= 1"),
    ({"max_tokens": 2.5}, "expected a whole number"),
    ({"stream": True}, "stream is not supported"),
    ({"max_tokens": 10**9}, "exceed the model's context of 2048 tokens"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be a whole number from 0 to 20"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs must be a whole number from 0 to 20"),
    ({"logprobs": True, "top_logprobs": True}, "top_logprobs must be a whole number from 0 to 20"),
    ({"logprobs": True, "top_logprobs": 2.0}, "top_logprobs must be a whole number from 0 to 20"),
    ({"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
    ({"logprobs": "false"}, "logprobs must be true or false"),  # a truthy string: it gave them
    ({"logprobs": 1}, "logprobs must be true or false"),
])
def test_bad_sampling_is_a_400_for_that_request_only(server, extra, words):
    """A value the engine would fail on mid-batch is refused up front: before, a bad stop string
    failed the step and with it every request in the batch."""
    status, data = call(server, "/chat/completions", chat("base", **extra))
    assert status == 400 and words in data["error"]["message"], data
    assert call(server, "/chat/completions", chat("base"))[0] == 200


@pytest.mark.parametrize("extra, words", [
    ({"n": 2}, "only n = 1 is supported"),
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": [{"role": "user", "content": None}]}, "messages must be a non-empty list of {role, content}"),
    ({"messages": [{"role": None, "content": "hi"}]}, "messages must be a non-empty list of {role, content}"),
    ({"messages": [{"role": "user", "content": []}]}, "each content a string or a list of text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages[0]: content parts of type image_url are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "messages[0]: a text part's text must be a string"),
    ({"n": True}, "n: expected a whole number, got True"),  # a bool is an int: taken as n = 1
    ({"n": 1.0}, "n: expected a whole number, got 1.0"),
    ({"stream": 0}, "stream must be true or false, got 0"),  # falsy: answered as unstreamed
    ({"stream": "false"}, "stream must be true or false, got 'false'"),  # truthy: "stream is not supported"
    ({"presence_penalty": False}, "presence_penalty is not supported"),  # False == 0: taken as the default
    ({"logit_bias": False}, "logit_bias is not supported"),
    ({"seed": True}, "seed: expected a whole number, got True"),  # it did not say which parameter
    ({"max_tokens": None, "max_completion_tokens": "8"}, "max_completion_tokens: expected a whole number, got '8'"),
    ({"max_tokens": 8, "max_completion_tokens": 3},  # max_completion_tokens was ignored
     "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported."),
    ({"n": 0}, "only n = 1 is supported"),
    ({"messages": [{"role": "user", "content": ["Say", "something."]}]}, "each content a string or a list of text parts"),
    ({"temperature": float("nan")}, "temperature: expected a number, got nan"),  # JSON's NaN, which Python reads
    # an integer float() cannot hold (OverflowError, a 500): refused as the infinity 1e400 reads as
    ({"temperature": 10**400}, "temperature must be 0 (greedy) or a number >= 0.001"),
    ({"top_p": -10**400}, "top_p must be in [1e-06, 1], got -inf"),
], ids=["n", "no-messages", "null-content", "null-role", "no-parts", "image-part", "number-text", "n-true", "n-float", "stream-0", "stream-string",
        "penalty-false", "logit-bias-false", "seed-true", "max-completion-tokens-string", "both-max-tokens", "n-0",
        "string-parts", "temperature-nan", "temperature-huge-int", "top-p-huge-int"])
def test_a_request_serve_cannot_take_as_sent_is_a_400(extra, words):
    """Mutants answering n = 2 or n = 0 with one choice, a message without its content or role, content as a
    list of strings (a 500), or NaN without naming temperature, passed every test.
    A value of the wrong JSON type is refused, naming its parameter, not read as a default."""
    from orchestrator.serve import ChatServer, HTTPError

    engine = RecordingEngine()
    with pytest.raises(HTTPError, match=re.escape(words)) as caught:
        asyncio.run(ChatServer(engine, "tiny").chat(chat("base", **extra)))
    assert caught.value.status == 400 and not engine.requests


def test_the_limits_themselves_are_accepted():
    """Mutants refusing 16 stop strings or top_logprobs 20 (the limits, not past them) passed every test."""
    from types import SimpleNamespace

    from orchestrator.serve import MAX_STOP, MAX_TOP_LOGPROBS, ChatServer

    engine = RecordingEngine()
    engine.tokenizer = SimpleNamespace(decode=lambda ids: "x")
    body = chat("base", stop=[str(i) for i in range(MAX_STOP)], logprobs=True, top_logprobs=MAX_TOP_LOGPROBS)
    asyncio.run(ChatServer(engine, "tiny").chat(body))
    assert (len(engine.requests[0].sampling.stop), engine.requests[0].sampling.top_logprobs) == (16, 20)


def test_options_left_out_are_openais_defaults():
    """temperature 1, top_p 1 and max_tokens 256 unasked, and an empty tools, functions or logit_bias
    is no ask: mutants sampling greedily unasked, or refusing tools: [], passed every test."""
    from orchestrator.engines.base import SamplingParams
    from orchestrator.serve import ChatServer

    engine = RecordingEngine()
    body = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "tools": [], "functions": [],
            "logit_bias": {}, "presence_penalty": 0}
    asyncio.run(ChatServer(engine, "tiny").chat(body))
    assert engine.requests[0].sampling == SamplingParams(temperature=1.0, top_p=1.0, max_tokens=256)


def test_content_given_as_text_parts_reaches_the_template_as_one_string():
    """OpenAI's other spelling of content (LangChain sends it) had been a 400; the parts are joined with
    newlines, as vLLM joins them, and the message's other keys are kept."""
    from orchestrator.serve import ChatServer

    class Engine(RecordingEngine):
        def apply_chat_template(self, messages):
            self.chat = messages
            return [1, 2, 3]

    engine = Engine()
    parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "something."}]
    body = chat("base", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts, "name": "ann"}])
    assert asyncio.run(ChatServer(engine, "tiny").chat(body))["choices"][0]["message"]["content"] == "hi"
    assert engine.chat == [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Say\nsomething.", "name": "ann"}]


def test_one_model_is_retrieved_by_its_name(server):
    """openai-python's models.retrieve(name) asks GET /v1/models/{name}; it had been a 404 for every name."""
    from orchestrator.serve import ChatServer, HTTPError

    status, data = call(server, "/models/judge")
    assert status == 200 and data == {"id": "judge", "object": "model", "created": data["created"], "owned_by": "rolecast"}
    status, data = call(server, "/models/nobody")
    assert status == 404 and data["error"]["code"] == "model_not_found" and "'nobody' not found" in data["error"]["message"]
    hub = ChatServer(RecordingEngine(), "Qwen/Qwen2.5-0.5B-Instruct")  # a hub id, or a path, holds a slash
    for path in ("/v1/models/Qwen/Qwen2.5-0.5B-Instruct", "/v1/models/Qwen%2FQwen2.5-0.5B-Instruct"):
        assert asyncio.run(hub.route("GET", path, b""))["id"] == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(HTTPError, match="not found"):
        asyncio.run(hub.route("GET", "/v1/models/Qwen", b""))


@pytest.mark.parametrize("method, path", [("GET", "/v1/models/"), ("GET", "/v1/models?limit=5"),
                                          ("POST", "/v1/chat/completions/")])
def test_a_route_is_found_past_a_trailing_slash_or_a_query(method, path):
    """Mutants reading the path with its query string or trailing slash passed every test."""
    from orchestrator.serve import ChatServer

    reply = asyncio.run(ChatServer(RecordingEngine(), "tiny").route(method, path, json.dumps(chat("base")).encode()))
    assert reply["object"] == ("list" if method == "GET" else "chat.completion")


@pytest.mark.parametrize("extra", [
    {"tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]},
    {"functions": [{"name": "add", "parameters": {"type": "object"}}]},
    {"logit_bias": {"198": -100}},
    {"presence_penalty": 1.5},
    {"frequency_penalty": -0.5},
], ids=lambda extra: next(iter(extra)))
def test_an_option_serve_does_not_honour_is_refused_not_ignored(extra):
    """Each was answered as if not asked: plain text for a client awaiting tool_calls, the banned
    token sampled, no penalty."""
    from orchestrator.serve import ChatServer, HTTPError

    class NoEngine:
        versions: dict = {}

    with pytest.raises(HTTPError, match=f"^{next(iter(extra))} is not supported") as caught:
        asyncio.run(ChatServer(NoEngine(), "tiny").chat(chat("base", **extra)))
    assert caught.value.status == 400


@pytest.mark.parametrize("extra, words, param", [
    ({"top_k": 1}, "Unrecognized request argument supplied: top_k", "top_k"),  # vLLM's: answered as if absent
    ({"repetition_penalty": 1.3, "min_p": 0.5}, "Unrecognized request arguments supplied: min_p, repetition_penalty",
     "min_p"),
    ({"reasoning_effort": "low"}, "Unrecognized request argument supplied: reasoning_effort", "reasoning_effort"),
], ids=["top_k", "two", "reasoning_effort"])
def test_an_argument_serve_does_not_know_is_refused_as_openai_does(extra, words, param):
    """Each was answered as if not sent: top_k 1 sampled from the whole vocabulary."""
    from orchestrator.serve import ChatServer, HTTPError

    engine = RecordingEngine()
    with pytest.raises(HTTPError, match=f"^{words}$") as caught:
        asyncio.run(ChatServer(engine, "tiny").chat(chat("base", **extra)))
    assert (caught.value.status, caught.value.kind, caught.value.param) == (400, "invalid_request_error", param)
    assert not engine.requests


def test_openais_bookkeeping_arguments_and_unknown_nulls_are_accepted():
    """user, metadata and the like change no reply; null is "not given", for an argument serve does not know too."""
    from orchestrator.engines.base import SamplingParams
    from orchestrator.serve import ChatServer

    engine = RecordingEngine()
    asyncio.run(ChatServer(engine, "tiny").chat(chat("base", user="u-1", safety_identifier="s", metadata={"run": "x"},
                                                     service_tier="auto", prompt_cache_key="k", top_k=None)))
    assert engine.requests[0].sampling == SamplingParams(temperature=0.0, max_tokens=8)


def test_a_request_the_vllm_engine_refuses_is_a_400(monkeypatch):
    """--engine vllm: what vLLM (or the backend for it) refuses raises ValueError from generate (a
    temperature it would change or refuses, a prompt past its context): each was a 500."""
    import fake_vllm
    from transformers import AutoTokenizer

    from orchestrator.models import checkpoint_dir
    from orchestrator.serve import ChatServer, HTTPError

    fake_vllm.install(monkeypatch)
    from orchestrator.engines.vllm import VLLMEngine

    engine = VLLMEngine("/models/base", tokenizer=AutoTokenizer.from_pretrained(checkpoint_dir(), local_files_only=True))
    server = ChatServer(engine, "tiny")
    with pytest.raises(HTTPError) as refused:
        asyncio.run(server.chat(chat("base", temperature=0.005)))
    assert refused.value.status == 400 and "or at least 0.01" in refused.value.message
    engine._llm.args.max_model_len = 8
    with pytest.raises(HTTPError) as refused:  # vLLM's own check, as the request is added
        asyncio.run(server.chat(chat("base")))
    assert refused.value.status == 400 and "longer than the maximum model length of 8" in refused.value.message
    engine._llm.args.max_model_len = None
    assert asyncio.run(server.chat(chat("base", temperature=0.5)))["choices"][0]["message"]["content"] == "hi"

    async def broken(request):  # a bug inside the engine that happens to be a ValueError
        raise ValueError("an engine bug")

    monkeypatch.setattr(engine, "generate", broken)
    with pytest.raises(ValueError, match="an engine bug"):  # not a 400: the server's own handler makes it a 500
        asyncio.run(server.chat(chat("base")))
    asyncio.run(engine.aclose())


def test_a_long_prompt_without_max_tokens_gets_the_room_it_leaves(server):
    """The default of 256 was refused as "max_tokens (256) exceed the model's context" past 1792
    prompt tokens, a max_tokens the client never sent."""
    body = chat("base", messages=[{"role": "user", "content": " hello" * 1900}])
    del body["max_tokens"]
    status, data = call(server, "/chat/completions", body)
    assert status == 200, data
    usage = data["usage"]
    assert 1792 < usage["prompt_tokens"] < 2048 and usage["total_tokens"] <= 2048


@pytest.mark.parametrize("context, max_tokens", [(None, 256), (1000, 256), (100, 97), (4, 1)])
def test_max_tokens_unasked_is_256_or_the_room_the_prompt_leaves(context, max_tokens):
    """Mutants defaulting to 128, or to one token short of the room left, passed every test."""
    from orchestrator.serve import ChatServer

    engine = RecordingEngine(context_length=context)  # its prompt is 3 tokens
    asyncio.run(ChatServer(engine, "tiny").chat(chat("base", max_tokens=None)))
    assert engine.requests[0].sampling.max_tokens == max_tokens


def test_a_prompt_exactly_as_long_as_the_context_leaves_no_room():
    """A mutant taking only a prompt past the context as too long refused this one as max_tokens 0."""
    from orchestrator.serve import ChatServer, HTTPError

    with pytest.raises(HTTPError, match=r"the prompt \(3 tokens\) leaves no room") as caught:
        asyncio.run(ChatServer(RecordingEngine(context_length=3), "tiny").chat(chat("base", max_tokens=None)))
    assert caught.value.code == "context_length_exceeded"


def test_a_prompt_that_fills_the_context_is_refused_as_such(server):
    """Without max_tokens it was refused as "the prompt and max_tokens (1) exceed the context", a
    max_tokens the client never sent."""
    body = chat("base", messages=[{"role": "user", "content": " hello" * 2100}])
    del body["max_tokens"]
    status, data = call(server, "/chat/completions", body)
    assert status == 400 and data["error"]["code"] == "context_length_exceeded", data
    assert re.fullmatch(r"the prompt \(\d+ tokens\) leaves no room for a reply in the model's context of 2048 tokens",
                        data["error"]["message"])


def test_a_reply_past_the_context_is_refused_in_openais_error_shape(server):
    """OpenAI's error says context_length_exceeded as its code, type invalid_request_error: said as
    the type, with no code, a client that checks the code (openai's BadRequestError.code) missed it."""
    status, data = call(server, "/chat/completions", chat("base", max_tokens=4000))
    assert status == 400 and data["error"]["type"] == "invalid_request_error", data
    assert data["error"]["code"] == "context_length_exceeded" and "exceed the model's context" in data["error"]["message"]


def test_null_sampling_values_are_the_defaults(server):
    """OpenAI's API reads null as "not given", and its clients send nulls."""
    status, data = call(server, "/chat/completions", chat("base", temperature=None, top_p=None, n=None, stop=None, seed=None,
                                                            tools=None, logit_bias={}, presence_penalty=0, frequency_penalty=0.0))
    assert status == 200, data


@pytest.mark.parametrize("headers, body, status, words", [
    ({"Content-Length": "50"}, b'{"model": "base"}', 400, "the body ended after 17 of its 50 bytes"),
    ({"Transfer-Encoding": "chunked"}, b"11\r\n" + b'{"model": "base"}' + b"\r\n0\r\n\r\n", 411, "chunked body"),
])
def test_a_body_that_cannot_be_read_is_a_client_error(server, headers, body, status, words):
    import socket
    from urllib.parse import urlparse

    url = urlparse(server)
    with socket.create_connection((url.hostname, url.port), timeout=30) as conn:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        conn.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body)
        conn.shutdown(socket.SHUT_WR)  # the short body ends here
        reply = b"".join(iter(lambda: conn.recv(65536), b""))
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()) and words in reply.decode(), reply


@pytest.mark.parametrize("head, words", [
    (b"GET /v1/models?q=" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", "longer than 64 KiB"),
    (b"GET /v1/models HTTP/1.1\r\nCookie: " + b"a" * 70000 + b"\r\n\r\n", "longer than 64 KiB"),
    (b"GET /v1/models HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", "bad Content-Length"),  # a digit int() refuses
    (b"GET /v1/models\r\n\r\n", "malformed request line"),  # no version: a mutant read it as a request
])
def test_a_bad_request_head_is_a_400(head, words):
    """Each was a ValueError: a 500 server_error (the reader's 64 KiB limit, int("²"))."""
    from orchestrator.serve import HTTPError, _read_request

    async def read():
        reader = asyncio.StreamReader()
        reader.feed_data(head)
        reader.feed_eof()
        return await _read_request(reader, None)  # no Expect: nothing written

    with pytest.raises(HTTPError, match=words) as caught:
        asyncio.run(read())
    assert caught.value.status == 400


def test_header_names_are_read_in_any_case_and_a_body_of_the_limit_is_read():
    """HTTP's header names are case-insensitive (Node's fetch sends them in lower case): mutants reading
    only "Content-Length" or "Transfer-Encoding" as spelt, or refusing a body of MAX_BODY bytes itself
    as too large, passed every test."""
    from orchestrator.serve import MAX_BODY, HTTPError, _read_request

    def read(head: bytes, body: bytes = b""):
        async def go():
            reader = asyncio.StreamReader()
            reader.feed_data(b"POST /v1/chat/completions HTTP/1.1\r\n" + head + b"\r\n" + body)
            reader.feed_eof()
            return await _read_request(reader, None)
        return asyncio.run(go())

    assert read(b"content-length: 2\r\n", b"{}") == ("POST", "/v1/chat/completions", b"{}")
    # no body, nothing to go on with: a 100 Continue here (the writer is None) would be a reply nobody waits for
    assert read(b"expect: 100-continue\r\ncontent-length: 0\r\n") == ("POST", "/v1/chat/completions", b"")
    assert len(read(b"CONTENT-LENGTH: %d\r\n" % MAX_BODY, b" " * MAX_BODY)[2]) == MAX_BODY
    # a Content-Length past int()'s 4300 digits was a ValueError, a 500: leading zeros are no size, others too large
    assert read(b"content-length: %s2\r\n" % (b"0" * 5000), b"{}")[2] == b"{}"
    for head, status in ((b"content-length: %d\r\n" % (MAX_BODY + 1), 413), (b"content-length: %s\r\n" % (b"9" * 5000), 413),
                         (b"transfer-encoding: chunked\r\n", 411)):
        with pytest.raises(HTTPError) as caught:
            read(head)
        assert caught.value.status == status


@pytest.mark.parametrize("body, words", [
    (b"[1]", "body must be a JSON object"),
    (b"[" * 100000 + b"]" * 100000, "body is nested too deeply"),  # past Python's recursion limit
    (b"{", "body is not JSON"),
    (b"", "model must be the name of one of: base, tiny"),  # no body: read as {}, the reply says what is missing
])
def test_a_body_that_is_no_json_object_is_a_400(body, words):
    """Mutants without the first two checks answered each with a 500 (a list has no .get, a RecursionError);
    one reading no body as JSON said only "Expecting value"."""
    from orchestrator.serve import ChatServer, HTTPError

    with pytest.raises(HTTPError, match=words) as caught:
        asyncio.run(ChatServer(RecordingEngine(), "tiny").route("POST", "/v1/chat/completions", body))
    assert caught.value.status == 400


def test_an_error_before_the_body_is_read_reaches_a_client_that_reads_to_the_end(monkeypatch):
    """The server half-closes as it lingers for the unread body: a client reading its reply to the
    connection's end (this one) got it at once; a mutant without write_eof held it the whole linger."""
    from orchestrator.serve import MAX_BODY, ChatServer

    monkeypatch.setattr("orchestrator.serve.LINGER_S", 120.0)  # past exchange's 30 s socket timeout
    sent = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1)
    assert exchange(ChatServer(None, "tiny"), sent)[0] == 413


def test_a_bad_content_length_is_a_400(server):
    import http.client
    from urllib.parse import urlparse

    url = urlparse(server)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Length", "abc")
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 400 and "bad Content-Length" in json.loads(response.read())["error"]["message"]


@pytest.mark.parametrize("chunked, status", [(False, 413), (True, 411)], ids=["too-large", "chunked"])
def test_a_request_refused_before_its_body_is_read_gets_its_error(chunked, status):
    """The unread body reset the connection under the reply: the client, still sending it, saw
    'Broken pipe', not the error (OpenAI clients retried, resending the body)."""
    import http.client

    from orchestrator.serve import MAX_BODY, ChatServer

    body = b"x" * (10 if chunked else MAX_BODY + 1)

    def post(port: int) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/chat/completions", iter([body]) if chunked else body, encode_chunked=chunked)
        response = conn.getresponse()
        return response.status, json.loads(response.read())

    async def go():
        server = await asyncio.start_server(ChatServer(None, "tiny").handle, "127.0.0.1", 0)
        async with server:
            return await asyncio.to_thread(post, server.sockets[0].getsockname()[1])

    reply_status, reply = asyncio.run(go())
    assert reply_status == status and reply["error"]["message"], reply


def test_a_client_that_expects_100_continue_is_told_to_go_on(server):
    """curl asks before a large body and, unanswered, waited a second before sending it."""
    import socket
    from urllib.parse import urlparse

    url, body = urlparse(server), json.dumps(chat("base")).encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"  # before the body is sent
        sock.sendall(body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and b'"chat.completion"' in reply


def test_the_url_shown_for_an_ipv6_host_is_a_url():
    from orchestrator.serve import base_url

    assert base_url("::1", 8000) == "http://[::1]:8000/v1"  # it said http://::1:8000/v1
    assert base_url("127.0.0.1", 8000) == "http://127.0.0.1:8000/v1"


def test_serve_refuses_a_busy_port_and_a_clashing_adapter_name_in_one_line(cli, tmp_path, monkeypatch):
    import socket

    def load_engine(*args, **kwargs):  # a name let through would serve until killed
        raise AssertionError("the clashing name was let through")

    monkeypatch.setattr("orchestrator.engines.load.load_engine", load_engine)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = cli("serve", "--model", "tiny", "--port", port)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err, err
    adapter = tiny_adapter(tmp_path / "judge")
    for name in ("base", "tiny"):  # the model's own name is the base model's too
        code, _, err = cli("serve", "--model", "tiny", "--adapter", f"{name}={adapter}")
        assert code == 2 and f"--adapter {name}: that name is the base model's" in err, err


def test_serve_refuses_a_port_past_65535():
    """A mutant without the range check listened on 70000 - 65536 = 4464: getaddrinfo wraps it."""
    import argparse

    from orchestrator.cli.serve import port_number

    assert port_number("0") == 0 and port_number("65535") == 65535
    for text in ("65536", "70000", "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"a port is 0-65535, got {text}"):
            port_number(text)
    with pytest.raises(argparse.ArgumentTypeError, match="not a port number: 'http'"):  # a mutant: argparse's
        port_number("http")  # "invalid port_number value"


def test_serve_stopped_by_sigterm_exits_0(cli, monkeypatch):
    """A server told to stop has done its job (Ctrl-C or SIGTERM: exit 0, docs/engine.md); a mutant
    letting the KeyboardInterrupt through exited 143, "rolecast: terminated"."""
    import os
    import signal

    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:  # the command would leave it to that handler:
        pytest.skip("this process handles SIGTERM itself")  # the signal below would reach the test runner's
    monkeypatch.setattr("orchestrator.engines.load.load_engine", lambda *args, **kwargs: None)

    async def serve(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(30)

    monkeypatch.setattr("orchestrator.serve.serve", serve)
    code, _, err = cli("serve", "--model", "tiny", "--port", "0")
    assert (code, err) == (0, ""), err


def test_a_client_that_hangs_up_cancels_its_generation():
    from orchestrator.serve import ChatServer

    class SlowEngine:  # generates until cancelled
        versions: dict = {}
        context_length = None

        def __init__(self):
            self.started, self.cancelled = asyncio.Event(), asyncio.Event()

        def apply_chat_template(self, messages):
            return [1, 2, 3]

        async def generate(self, request):
            self.started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise

    async def go():
        engine = SlowEngine()
        server = await asyncio.start_server(ChatServer(engine, "tiny").handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = json.dumps(chat("base")).encode()
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            await asyncio.wait_for(engine.started.wait(), 10)
            writer.close()
            await asyncio.wait_for(engine.cancelled.wait(), 10)

    asyncio.run(go())


@pytest.mark.parametrize("sent", [b"", b"GET /v1/models HTTP/1.1\r\n\r\n"], ids=["before-its-request", "after-it"])
def test_a_client_that_resets_the_connection_is_gone_quietly(sent):
    """A reset (a TCP health check, a killed client) was a serve.error and, at the reply's drain, an
    "Unhandled exception in client_connected_cb" traceback in the server's output."""
    import socket
    import struct

    from structlog.testing import capture_logs

    from orchestrator.serve import ChatServer

    class NoEngine:
        versions: dict = {}

    errors = []

    async def go():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        chat = ChatServer(NoEngine(), "tiny")
        server = await asyncio.start_server(chat.handle, "127.0.0.1", 0)
        async with server:
            with socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1])) as conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a RST
                conn.sendall(sent)
            for _ in range(500):
                await asyncio.sleep(0.01)
                if not chat.handlers:
                    break

    with capture_logs() as logs:
        asyncio.run(go())
    assert not errors and not [e for e in logs if e["log_level"] == "error"], (errors, logs)


def test_a_chat_the_models_template_refuses_is_a_400():
    """Templates that raise (Gemma's "System role not supported", Mistral's roles that must alternate)
    made a 500 server_error of the client's messages, which OpenAI clients retry."""
    from support import tiny_engine

    from orchestrator.serve import ChatServer, HTTPError

    engine = tiny_engine()
    engine.tokenizer.chat_template = "{{ raise_exception('System role not supported') }}"
    with pytest.raises(HTTPError, match="System role not supported") as caught:
        asyncio.run(ChatServer(engine, "tiny").chat(chat("base")))
    assert caught.value.status == 400


def test_a_generation_past_the_request_timeout_is_a_504_not_a_408(monkeypatch):
    """408 Request Timeout says the client was slow to send its request: a reply the engine had not
    finished in the server's time was answered so."""
    from support import tiny_engine

    from orchestrator.serve import ChatServer, HTTPError

    engine = tiny_engine()

    async def stuck(request):
        await asyncio.sleep(10)

    monkeypatch.setattr(engine, "generate", stuck)
    with pytest.raises(HTTPError, match=r"no reply within the server's request timeout \(0.1 s\)") as caught:
        asyncio.run(ChatServer(engine, "tiny", request_timeout_s=0.1).chat(chat("base")))
    assert (caught.value.status, caught.value.kind) == (504, "timeout")


def test_shutdown_with_a_request_in_flight_closes_the_engine_quietly():
    """Cancelling serve (Ctrl-C, SIGTERM) closes its engine: before, the scheduler went on decoding
    for nobody while the process exited, and its step aborted the interpreter (SIGABRT). Its
    connections end without the tracebacks asyncio.run's shutdown printed for each (Python 3.11)."""
    from support import tiny_engine

    from orchestrator.serve import serve

    engine = tiny_engine()
    errors = []

    async def client(port, serving):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        # seeded: an unseeded draw could end the reply before the engine was seen busy
        body = json.dumps(chat("base", max_tokens=2000, temperature=1.0, seed=3)).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        for _ in range(1000):
            if engine.busy:
                break
            await asyncio.sleep(0.01)
        assert engine.busy
        serving.cancel()  # as asyncio.run does on Ctrl-C

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        serving = asyncio.current_task()
        await serve(engine, "tiny", "127.0.0.1", 0, {}, lambda port: asyncio.create_task(client(port, serving)))

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert engine.busy == 0 and not errors, errors
