"""The policy seam: a request with the chat so far, an output with text (and tokens if any)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import SamplingConfig
from ..transcript import Attempt


@dataclass(frozen=True)
class PolicyRequest:
    role: str
    episode: str  # episode id
    episode_index: int
    turn: int
    attempt: int  # 0 for the first try, then one per retry
    messages: list[dict[str, str]]
    context: dict[str, Any]  # the template variables the prompt was rendered from
    sampling: SamplingConfig
    adapter: str | None
    seed: int  # derived from the run seed, episode, turn and attempt
    reply_prefix: str = ""  # model policies start their reply with it (see RoleConfig)
    json_schema: str | None = None  # set: constrain the reply to this JSON schema (canonical JSON text)
    # The earlier attempt whose messages and reply ``messages`` continue (a retry, or a
    # conversation role's later turn): model policies reuse its tokens instead of re-rendering.
    extends: Attempt | None = None


@dataclass
class PolicyOutput:
    text: str
    prompt_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    adapter: str | None = None
    adapter_version: int | None = None
    # The schema the tokens were sampled under (their logprobs are of the masked distribution),
    # and how many trailing tokens closed the reply by force (see engines/base.Completion).
    json_schema: str | None = None
    forced_tokens: int = 0
    spelled: bool = False  # see engines/base.Completion
    completion_tokens: int | None = None  # tokens generated where no token_ids came back (an API's usage)
    extra: dict[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    """Any async callable; returning a bare string is the same as ``PolicyOutput(text=...)``."""

    async def __call__(self, request: PolicyRequest) -> PolicyOutput | str: ...
