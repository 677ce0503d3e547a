"""``builtin:stub``: replies with the smallest message the role's schema accepts, instantly.

For dry runs of a team (routing, prompts, transcripts) without a model, and for benchmarks of
the orchestrator itself.
"""
from __future__ import annotations

import json

from ..role import RoleSpec
from .base import PolicyOutput, PolicyRequest
from .instances import minimal_instance


class StubPolicy:
    def __init__(self, spec: RoleSpec):
        self.text = json.dumps(minimal_instance(spec.schema))

    async def __call__(self, request: PolicyRequest) -> PolicyOutput:
        return PolicyOutput(text=self.text)
