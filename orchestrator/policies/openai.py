"""A counterpart served elsewhere: any OpenAI-compatible ``/v1/chat/completions`` endpoint
(``rolecast serve``, ``vllm serve``, a llama.cpp server, ...). Binding: ``openai:MODEL@BASE_URL``.

The reply prefix of a role cannot be pre-filled through this API, so it is not used; the API
key, if the server wants one, comes from ``OPENAI_API_KEY``. A request with a JSON schema is sent
with ``response_format: {"type": "json_schema", ...}``; a server that rejects that field gets
plain requests from then on (the reply is still validated against the schema). A 408, 409, 429 or
5xx, or a connection refused or dropped, is asked again twice, after 0.5 s then 1 s or the
server's Retry-After (60 s at most), as OpenAI's own client does.
"""
from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future
from typing import Any

import structlog

from ..errors import PolicyError
from .base import PolicyOutput, PolicyRequest

log = structlog.get_logger()
# urllib's timeout bounds each socket read, not the reply: one that trickles in is cut this long after it
GRACE_S = 5.0
# A server throttling (429) or failing in passing (5xx, a connection refused or dropped) is asked
# again, as OpenAI's own client does: a busy vLLM's 503 had failed the episode. Waits double from
# BACKOFF_S, or are the server's Retry-After (capped).
RETRIED_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
RETRIES, BACKOFF_S, MAX_WAIT_S = 2, 0.5, 60.0


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is the policy's error: urllib would resend the API key to wherever it points
    (another host too) and the POST as a GET without its body."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


OPENER = urllib.request.build_opener(NoRedirect)


class Transient(PolicyError):
    """A fault that asking again may cure; ``retry_after``: the server's wait, in seconds, if it gave one."""

    retry_after: float | None = None


class HTTPStatusError(PolicyError):
    def __init__(self, message: str, status: int, detail: str):
        super().__init__(message)
        self.status, self.detail = status, detail


class TransientStatus(HTTPStatusError, Transient):
    def __init__(self, message: str, status: int, detail: str, retry_after: str | None):
        super().__init__(message, status, detail)
        try:
            self.retry_after = max(0.0, float(retry_after)) if retry_after is not None else None
        except ValueError:  # an HTTP date: the backoff's own wait will do
            self.retry_after = None


def response_format(name: str, schema_text: str) -> dict[str, Any]:
    """OpenAI's structured-output request for a schema; ``name`` must match [A-Za-z0-9_-]{1,64}."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "reply"
    return {"type": "json_schema", "json_schema": {"name": safe, "schema": json.loads(schema_text), "strict": True}}


def parse_target(target: str) -> tuple[str, str]:
    model, sep, url = target.rpartition("@")
    parts = urllib.parse.urlsplit(url)
    # a URL with no host (http://, http:///v1) had passed here, and failed every episode
    if not sep or not model or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"openai policy {target!r} must look like MODEL@http://host:port/v1")
    try:
        parts.port  # a port that is no number (host:80a) is a ValueError here, not at every request
    except ValueError:
        raise ValueError(f"openai policy {target!r}: its port is no number") from None
    return model, url.rstrip("/")


class OpenAIPolicy:
    def __init__(self, target: str, timeout_s: float = 120.0):
        self.model, self.base_url = parse_target(target)
        self.timeout = timeout_s
        self.send_response_format = True  # until the server rejects it

    async def __call__(self, request: PolicyRequest) -> PolicyOutput:
        try:
            return await self._reply(request)
        except PolicyError as exc:  # roles may share a server: the episode's error says whose, as the engine policy's does
            raise PolicyError(f"role {request.role!r}, turn {request.turn}: {exc}") from None

    async def _reply(self, request: PolicyRequest) -> PolicyOutput:
        s = request.sampling
        body = {"model": self.model, "messages": request.messages, "temperature": s.temperature, "top_p": s.top_p,
                "max_tokens": s.max_tokens, "seed": request.seed}
        if s.stop:
            body["stop"] = list(s.stop)
        if request.json_schema and self.send_response_format:
            body["response_format"] = response_format(request.role, request.json_schema)
        try:
            data = await self._send(body)
        except HTTPStatusError as exc:
            if "response_format" not in body or exc.status not in (400, 422) or "response_format" not in exc.detail:
                raise
            log.warning("openai.response_format_rejected", url=self.base_url, detail=exc.detail[:200])
            self.send_response_format = False
            del body["response_format"]
            data = await self._send(body)
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            text = None
        if not isinstance(text, str):  # a number or an object for content is no reply either
            raise PolicyError(f"{self.base_url}: unexpected response {str(data)[:200]}")
        usage = data.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None  # for the run's throughput
        return PolicyOutput(text=text, finish_reason=choice.get("finish_reason"),
                            completion_tokens=tokens if type(tokens) is int and tokens >= 0 else None)

    async def _send(self, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in itertools.count():
            try:
                return await asyncio.wait_for(asyncio.wrap_future(self._posted(body)), self.timeout + GRACE_S)
            except TimeoutError:  # bare, it would name neither the server nor the time it had
                raise PolicyError(f"{self.base_url}: no reply within {self.timeout + GRACE_S:g}s") from None
            except Transient as exc:
                if attempt == RETRIES:
                    raise PolicyError(f"{exc} (asked {RETRIES + 1} times)") from None
                wait = min(exc.retry_after if exc.retry_after is not None else BACKOFF_S * 2 ** attempt, MAX_WAIT_S)
                log.info("openai.retry", url=self.base_url, error=str(exc)[:200], wait_s=wait)
                await asyncio.sleep(wait)

    def _posted(self, body: dict[str, Any]) -> Future:
        """``_post(body)`` in a daemon thread of its own: a pool (asyncio's holds cores + 4) let 6 of 32
        episodes' requests reach the server at once, and the rest timed out in its queue; and the
        interpreter waits at exit for a pool's threads, a request given up on (Ctrl-C, an episode's
        timeout) until its socket timed out, or forever for a server that trickles."""
        posted: Future = Future()

        def post() -> None:
            if posted.set_running_or_notify_cancel():  # False: given up on before it started
                try:
                    posted.set_result(self._post(body))
                except BaseException as exc:
                    posted.set_exception(exc)

        threading.Thread(target=post, name="openai-policy", daemon=True).start()
        return posted

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
        req = urllib.request.Request(f"{self.base_url}/chat/completions", json.dumps(body).encode(), headers)
        try:
            with OPENER.open(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read().decode(errors="replace")[:300]
            except (OSError, http.client.HTTPException) as cut:  # the error's body cut short: its status still tells
                detail = f"(its body cut short: {cut})"
            if 300 <= exc.code < 400:  # not followed (NoRedirect)
                detail = f"redirected to {exc.headers.get('Location')}: bind the base URL it points to"
            message = f"{self.base_url}: HTTP {exc.code}: {detail}"
            if exc.code in RETRIED_STATUS:
                raise TransientStatus(message, exc.code, detail, exc.headers.get("Retry-After")) from None
            raise HTTPStatusError(message, exc.code, detail) from None
        # OSError: URLError, timeouts, and a connection dropped while the response is read (urlopen
        # wraps only the request's faults in URLError); RecursionError: a response nested too deeply
        except (OSError, http.client.HTTPException, ValueError, RecursionError) as exc:
            if isinstance(exc, ConnectionError) or isinstance(getattr(exc, "reason", None), ConnectionError):
                raise Transient(f"{self.base_url}: {exc}") from None  # refused, reset, hung up
            raise PolicyError(f"{self.base_url}: {exc}") from None
