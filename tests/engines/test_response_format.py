"""A role's JSON schema from the OpenAI client policy, over loopback HTTP, to ``rolecast serve``'s engine.

The server side runs ``ChatServer`` in-process over a recording engine, so the test sees the
GenerationRequest the schema arrives in; tests/engines/test_serve.py drives the real
``rolecast serve`` process.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from dataclasses import replace

import pytest

from orchestrator.config import SamplingConfig
from orchestrator.engines.base import Completion, GenerationRequest
from orchestrator.errors import PolicyError
from orchestrator.messages import schema_json
from orchestrator.policies import openai
from orchestrator.policies.base import PolicyOutput, PolicyRequest
from orchestrator.policies.openai import OpenAIPolicy, response_format
from orchestrator.serve import ChatServer, HTTPError, response_schema

SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["approve", "request_changes"]}},
          "required": ["verdict"], "additionalProperties": False}


class RecordingEngine:
    """Answers every request with a fixed reply and keeps the requests it was given."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []
        self.chats: list[list[dict]] = []
        self.versions: dict[str, int] = {}

    def apply_chat_template(self, messages):
        self.chats.append(messages)
        return [1, 2, 3]

    async def generate(self, request: GenerationRequest) -> Completion:
        self.requests.append(request)
        return Completion([7, 8], '{"verdict": "approve"}', [-0.1, -0.2], "eos")


class NoResponseFormatServer(ChatServer):
    """A server that, like some OpenAI-compatible ones, refuses the field."""

    seen: list[dict] = []

    async def chat(self, req):
        type(self).seen.append(req)
        if "response_format" in req:
            raise HTTPError(400, "unsupported parameter: response_format")
        return await super().chat(req)


@contextlib.asynccontextmanager
async def serving(engine, server_class=ChatServer):
    server = await asyncio.start_server(server_class(engine, "tiny").handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await server.wait_closed()


def policy_request(role="reviewer", json_schema=None) -> PolicyRequest:
    return PolicyRequest(role=role, episode="e0", episode_index=0, turn=0, attempt=0,
                         messages=[{"role": "user", "content": "Review this."}], context={},
                         sampling=SamplingConfig(temperature=0.0, max_tokens=32), adapter=None, seed=3,
                         json_schema=json_schema)


async def test_schema_travels_from_the_policy_to_the_engine_request():
    engine = RecordingEngine()
    async with serving(engine) as url:
        out = await OpenAIPolicy(f"base@{url}")(policy_request(json_schema=schema_json(SCHEMA)))
        await OpenAIPolicy(f"base@{url}")(policy_request())
    assert json.loads(out.text) == {"verdict": "approve"}
    constrained, free = engine.requests
    assert constrained.json_schema == schema_json(SCHEMA) and json.loads(constrained.json_schema) == SCHEMA
    assert free.json_schema is None


def test_response_format_shape():
    fmt = response_format("code reviewer/2", schema_json(SCHEMA))
    assert fmt == {"type": "json_schema", "json_schema": {"name": "code_reviewer_2", "schema": SCHEMA, "strict": True}}
    assert response_format("r" * 80, schema_json(SCHEMA))["json_schema"]["name"] == "r" * 64  # OpenAI's limit


@pytest.mark.parametrize("fmt, expected", [
    (None, None),
    ({"type": "text"}, None),
    ({"type": "json_object"}, {"type": "object"}),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}, SCHEMA),
])
def test_serve_reads_response_format(fmt, expected):
    text = response_schema(fmt)
    assert (text if text is None else json.loads(text)) == expected


@pytest.mark.parametrize("fmt, message", [
    ({"type": "xml"}, "not supported"),
    ("json", "not supported"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "must be a JSON object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}, "invalid JSON Schema"),
])
def test_serve_rejects_bad_response_format(fmt, message):
    with pytest.raises(HTTPError, match=message) as info:
        response_schema(fmt)
    assert info.value.status == 400


async def test_the_roles_messages_sampling_and_seed_travel_to_the_server():
    engine = RecordingEngine()
    request = replace(policy_request(), sampling=SamplingConfig(temperature=0.3, top_p=0.9, max_tokens=7, stop=["END"]),
                      seed=42, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}])
    async with serving(engine) as url:
        await OpenAIPolicy(f"base@{url}/")(request)  # a base URL's trailing slash is no part of the path
    (sent,) = engine.requests
    assert engine.chats == [request.messages]
    s = sent.sampling
    assert (s.temperature, s.top_p, s.max_tokens, s.stop, s.seed) == (0.3, 0.9, 7, ("END",), 42)


async def test_a_server_without_response_format_gets_plain_requests():
    NoResponseFormatServer.seen = []
    engine = RecordingEngine()
    policy = None
    async with serving(engine, NoResponseFormatServer) as url:
        policy = OpenAIPolicy(f"base@{url}")
        first = await policy(policy_request(json_schema=schema_json(SCHEMA)))
        await policy(policy_request(json_schema=schema_json(SCHEMA)))
    assert json.loads(first.text) == {"verdict": "approve"}
    # refused once, retried without it, and not sent again
    assert ["response_format" in r for r in NoResponseFormatServer.seen] == [True, False, False]
    assert NoResponseFormatServer.seen[0]["response_format"] == response_format("reviewer", schema_json(SCHEMA))
    assert not policy.send_response_format


async def test_a_role_played_through_the_api_counts_the_tokens_its_server_says_it_generated(tmp_path):
    """No token ids come back over the API: the run's generated_tokens counts the response's
    usage.completion_tokens, not 0 (each reply here is two tokens)."""
    from pathlib import Path

    from orchestrator.policies.binding import Binding
    from orchestrator.rollout import RunOptions, build_policies, run_team
    from orchestrator.team import load_team

    team = load_team(Path(__file__).resolve().parents[2] / "recipes/debate.yaml")
    async with serving(RecordingEngine()) as url:
        bindings = {"pro": Binding("builtin", "stub"), "con": Binding("builtin", "stub"), "judge": Binding("openai", f"base@{url}")}
        result = await run_team(team, build_policies(team, bindings, lambda: None),
                                RunOptions(episodes=2, seed=0, out_dir=tmp_path, progress=False))
    attempts = [a for e in result.episodes for t in e.turns if t.role == "judge" for a in t.attempts]
    assert attempts and all(a.token_ids is None and a.completion_tokens == 2 for a in attempts)
    assert result.summary["generated_tokens"] == 2 * len(attempts)


async def test_other_http_errors_still_fail():
    async with serving(RecordingEngine()) as url:
        with pytest.raises(PolicyError, match="HTTP 404"):
            await OpenAIPolicy(f"nope@{url}")(policy_request(json_schema=schema_json(SCHEMA)))


async def test_a_reply_that_never_ends_is_the_policys_error_not_an_episode_timeout(monkeypatch):
    # urllib times each read, so a server that trickles bytes is cut only by the policy's own bound
    release = threading.Event()
    policy = OpenAIPolicy("base@http://127.0.0.1:9/v1", timeout_s=0.1)
    monkeypatch.setattr(openai, "GRACE_S", 0.1)
    monkeypatch.setattr(policy, "_post", lambda body: release.wait(10))
    try:
        with pytest.raises(PolicyError, match="no reply within 0.2s"):
            await policy(policy_request())
    finally:
        release.set()


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    """Retries of a 429 or 5xx at once: the waits themselves are not what these tests measure."""
    monkeypatch.setattr(openai, "BACKOFF_S", 0.0)


@contextlib.asynccontextmanager
async def answering(raw: bytes, *later: bytes, asked: list[bytes] | None = None):
    """A server that reads a request and sends back ``raw`` whatever it asked (b"": hangs up), then
    each of ``later`` to the requests after it (the last one from then on); ``asked`` collects the
    requests' heads."""
    replies = [raw, *later]

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        if asked is not None:
            asked.append(head)
        writer.write(replies.pop(0) if len(replies) > 1 else replies[0])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("raw", [
    b"",
    b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choices": [',
    b'HTTP/1.1 200 OK\r\nContent-Length: 43\r\n\r\n{"choices": [{"message": {"content": 12}}]}',
    b'HTTP/1.1 500 Error\r\nContent-Length: 100\r\n\r\n{"error": ',
], ids=["hung-up", "cut-short", "number-content", "error-cut-short"])
async def test_a_broken_response_is_a_policy_error_naming_the_server(raw):
    async with answering(raw) as url:
        with pytest.raises(PolicyError, match=re.escape(url)):
            await OpenAIPolicy(f"base@{url}")(policy_request())


async def test_a_failed_request_names_the_role_and_its_turn():
    """Every role bound to one server failed as that server's "HTTP 429": which role's request
    it was, the episode's error did not say (the engine policy's errors do)."""
    raw = b'HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}'
    async with answering(raw) as url:
        with pytest.raises(PolicyError, match=f"^role 'judge', turn 0: {re.escape(url)}: HTTP 429"):
            await OpenAIPolicy(f"base@{url}")(policy_request(role="judge"))


REPLY = b'{"choices": [{"message": {"content": "{}"}}]}'
OK = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(REPLY), REPLY)


def response(status: str, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status.encode(), len(body), body)


async def test_a_reply_without_content_its_finish_reason_and_a_usage_that_is_no_count(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    body = b'{"choices": [{"message": {"content": null}, "finish_reason": "length"}], "usage": {"completion_tokens": -1}}'
    flag = b'{"choices": [{"message": {"content": "{}"}}], "usage": {"completion_tokens": true}}'  # JSON's true is no count
    asked: list[bytes] = []
    async with answering(response("200 OK", body), response("200 OK", flag), asked=asked) as url:
        policy = OpenAIPolicy(f"base@{url}")
        out, flagged = await policy(policy_request()), await policy(policy_request())
    assert (out.text, out.finish_reason, out.completion_tokens) == ("", "length", None)
    assert flagged.completion_tokens is None
    assert b"Authorization: Bearer sk-secret\r\n" in asked[0]


async def test_a_422_about_response_format_drops_it_and_any_other_400_is_the_error():
    asked: list[bytes] = []
    refused = response("422 Unprocessable Entity", b'{"error": "unknown field: response_format"}')
    async with answering(refused, OK, asked=asked) as url:
        policy = OpenAIPolicy(f"base@{url}")
        assert (await policy(policy_request(json_schema=schema_json(SCHEMA)))).text == "{}"
    assert len(asked) == 2 and not policy.send_response_format
    asked.clear()
    async with answering(response("400 Bad Request", b'{"error": "max_tokens too large"}'), OK, asked=asked) as url:
        policy = OpenAIPolicy(f"base@{url}")
        with pytest.raises(PolicyError, match="HTTP 400: .*max_tokens too large"):
            await policy(policy_request(json_schema=schema_json(SCHEMA)))
    assert len(asked) == 1 and policy.send_response_format


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
async def test_a_server_throttling_or_failing_in_passing_is_asked_again(status):
    """One 429 or 503 from a busy server failed the episode: OpenAI's own client asks again."""
    busy = b"HTTP/1.1 %d Busy\r\nContent-Length: 2\r\n\r\n{}" % status
    asked: list[bytes] = []
    async with answering(busy, busy, OK, asked=asked) as url:
        out = await OpenAIPolicy(f"base@{url}")(policy_request())
    assert out.text == "{}" and len(asked) == 3


async def test_a_server_hanging_up_without_a_reply_is_asked_again():
    asked: list[bytes] = []
    async with answering(b"", OK, asked=asked) as url:  # a ConnectionError of its own, not wrapped in a URLError
        assert (await OpenAIPolicy(f"base@{url}")(policy_request())).text == "{}"
    assert len(asked) == 2


async def test_a_400_naming_response_format_for_a_request_without_it_is_the_error():
    refused = response("400 Bad Request", b'{"error": "response_format: not supported"}')
    async with answering(refused) as url:
        with pytest.raises(PolicyError, match="HTTP 400: .*response_format: not supported"):
            await OpenAIPolicy(f"base@{url}")(policy_request())


async def test_a_server_that_never_answers_is_cut_at_the_timeout_by_the_socket():
    """urllib's own timeout ends the request (and frees its thread) before the policy's grace."""
    done = asyncio.Event()

    async def silent(reader, writer):
        await done.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        with pytest.raises(PolicyError, match=f"{re.escape(url)}: timed out"):
            await OpenAIPolicy(f"base@{url}", timeout_s=0.3)(policy_request())
    finally:
        done.set()
        server.close()
        await server.wait_closed()


async def test_retries_end_and_say_so_and_a_request_refused_for_itself_is_not_retried():
    asked: list[bytes] = []
    async with answering(b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\n{}", asked=asked) as url:
        with pytest.raises(PolicyError, match=r"HTTP 503: \{\} \(asked 3 times\)$"):
            await OpenAIPolicy(f"base@{url}")(policy_request())
    assert len(asked) == 3
    asked.clear()
    async with answering(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}", asked=asked) as url:
        with pytest.raises(PolicyError, match=r"HTTP 404: \{\}$"):
            await OpenAIPolicy(f"base@{url}")(policy_request())
    assert len(asked) == 1


async def test_the_servers_retry_after_is_the_wait(monkeypatch):
    waits = []
    real_sleep = asyncio.sleep

    async def sleep(seconds):
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(openai.asyncio, "sleep", sleep)
    monkeypatch.setattr(openai, "BACKOFF_S", 0.25)  # not no_backoff's 0: a wait that is no backoff's would pass
    throttled = b"HTTP/1.1 429 Slow down\r\nRetry-After: 7\r\nContent-Length: 2\r\n\r\n{}"
    dated = b"HTTP/1.1 429 Slow down\r\nRetry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\nContent-Length: 2\r\n\r\n{}"
    async with answering(throttled, dated, OK) as url:
        assert (await OpenAIPolicy(f"base@{url}")(policy_request())).text == "{}"
    assert waits == [7.0, openai.BACKOFF_S * 2]  # a date is no number of seconds: the backoff's wait
    waits.clear()
    hour = b"HTTP/1.1 503 Busy\r\nRetry-After: 3600\r\nContent-Length: 2\r\n\r\n{}"
    past = b"HTTP/1.1 503 Busy\r\nRetry-After: -5\r\nContent-Length: 2\r\n\r\n{}"
    async with answering(hour, past, OK) as url:
        assert (await OpenAIPolicy(f"base@{url}")(policy_request())).text == "{}"
    assert waits == [openai.MAX_WAIT_S, 0.0]


async def test_a_refused_connection_is_asked_again(monkeypatch):
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    tries = []
    real = OpenAIPolicy._post

    def post(self, body):
        tries.append(1)
        return real(self, body)

    monkeypatch.setattr(OpenAIPolicy, "_post", post)
    with pytest.raises(PolicyError, match=r"Connection refused.*\(asked 3 times\)$"):
        await OpenAIPolicy(f"base@http://127.0.0.1:{port}/v1")(policy_request())
    assert len(tries) == 3


@pytest.mark.parametrize("code", [301, 302, 307])
async def test_a_redirect_is_an_error_and_the_api_key_stays_home(monkeypatch, code):
    # followed, a 301/302 sent the key to the other host, and the chat as a GET without its body
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    reached = []
    elsewhere = await asyncio.start_server(lambda reader, writer: reached.append(writer.close()), "127.0.0.1", 0)
    target = f"http://localhost:{elsewhere.sockets[0].getsockname()[1]}/v1/chat/completions"
    try:
        raw = b"HTTP/1.1 %d Moved\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % (code, target.encode())
        async with answering(raw) as url:
            with pytest.raises(PolicyError, match=f"HTTP {code}: redirected to {re.escape(target)}"):
                await OpenAIPolicy(f"base@{url}")(policy_request())
    finally:
        elsewhere.close()
        await elsewhere.wait_closed()
    assert reached == []


def test_a_request_left_hanging_does_not_hold_the_process_at_exit():
    """Its thread blocked on the socket until the policy's timeout (120s by default; forever for a
    server that trickles): Ctrl-C or an episode's timeout left the process waiting that long to exit."""
    import subprocess
    import sys
    from pathlib import Path

    script = """
import asyncio, socket
from orchestrator.config import SamplingConfig
from orchestrator.policies.base import PolicyRequest
from orchestrator.policies.openai import OpenAIPolicy
server = socket.create_server(("127.0.0.1", 0))  # connects, never answers
policy = OpenAIPolicy(f"base@http://127.0.0.1:{server.getsockname()[1]}/v1", timeout_s=60)
request = PolicyRequest("r", "e0", 0, 0, 0, [{"role": "user", "content": "hi"}], {}, SamplingConfig(), None, 0)
try:
    asyncio.run(asyncio.wait_for(policy(request), 0.5))
except TimeoutError:
    print("gave up")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, timeout=30)
    assert out.stdout == "gave up\n", out.stderr


async def test_requests_reach_the_server_all_at_once(monkeypatch):
    # more than asyncio's default thread pool holds anywhere (32 at most): each reply waits for all
    n, arrived, everyone = 33, [], asyncio.Event()

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        arrived.append(1)
        if len(arrived) == n:
            everyone.set()
        await everyone.wait()
        body = b'{"choices": [{"message": {"content": "{}"}}]}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    monkeypatch.setattr(openai, "GRACE_S", 0.0)
    policy = OpenAIPolicy(f"base@http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", timeout_s=3.0)
    try:
        outs = await asyncio.gather(*(policy(policy_request()) for _ in range(n)), return_exceptions=True)
    finally:
        everyone.set()
        server.close()
        await server.wait_closed()
    assert [out.text if isinstance(out, PolicyOutput) else str(out) for out in outs] == ["{}"] * n
