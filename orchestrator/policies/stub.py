"""``builtin:stub``: replies with the smallest message the role's schema accepts, instantly.

For dry runs of a team (routing, prompts, transcripts) without a model, and for benchmarks of
the orchestrator itself.
"""
from __future__ import annotations

import json
from typing import Any

from ..role import RoleSpec
from .base import PolicyOutput, PolicyRequest


def minimal_instance(schema: dict[str, Any]) -> Any:
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return minimal_instance(schema[key][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        return {name: minimal_instance(props.get(name, {})) for name in schema.get("required", [])}
    if kind == "array":
        return [minimal_instance(schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        return "x" * max(1, schema.get("minLength", 1))
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return None


class StubPolicy:
    def __init__(self, spec: RoleSpec):
        self.text = json.dumps(minimal_instance(spec.schema))

    async def __call__(self, request: PolicyRequest) -> PolicyOutput:
        return PolicyOutput(text=self.text)
