"""A counterpart served elsewhere: any OpenAI-compatible ``/v1/chat/completions`` endpoint
(``rolecast serve``, ``vllm serve``, a llama.cpp server, ...). Binding: ``openai:MODEL@BASE_URL``.

The reply prefix of a role cannot be pre-filled through this API, so it is not used; the API
key, if the server wants one, comes from ``OPENAI_API_KEY``.
"""
from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from typing import Any

from ..errors import PolicyError
from .base import PolicyOutput, PolicyRequest


def parse_target(target: str) -> tuple[str, str]:
    model, sep, url = target.rpartition("@")
    if not sep or not model or not url.startswith(("http://", "https://")):
        raise ValueError(f"openai policy {target!r} must look like MODEL@http://host:port/v1")
    return model, url.rstrip("/")


class OpenAIPolicy:
    def __init__(self, target: str, timeout_s: float = 120.0):
        self.model, self.base_url = parse_target(target)
        self.timeout = timeout_s

    async def __call__(self, request: PolicyRequest) -> PolicyOutput:
        s = request.sampling
        body = {"model": self.model, "messages": request.messages, "temperature": s.temperature, "top_p": s.top_p,
                "max_tokens": s.max_tokens, "seed": request.seed}
        if s.stop:
            body["stop"] = list(s.stop)
        data = await asyncio.wait_for(asyncio.to_thread(self._post, body), self.timeout + 5)
        try:
            choice = data["choices"][0]
            return PolicyOutput(text=choice["message"]["content"] or "", finish_reason=choice.get("finish_reason"))
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"{self.base_url}: unexpected response {str(data)[:200]}") from None

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
        req = urllib.request.Request(f"{self.base_url}/chat/completions", json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise PolicyError(f"{self.base_url}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ValueError) as exc:
            raise PolicyError(f"{self.base_url}: {exc}") from None
