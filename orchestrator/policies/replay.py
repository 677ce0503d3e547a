"""Replay a JSONL file of ``{"role": ..., "text": ...}`` lines, in order per role.

Every episode replays the file from its start, so a run is the same whatever the concurrency;
lines with an ``"episode": N`` key are used only by the episode with that index.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, PolicyError
from ..yamlfile import load_json_lines
from .base import PolicyOutput, PolicyRequest


class ReplayPolicy:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lines: list[dict] = []
        for n, line in load_json_lines(self.path):
            if not isinstance(line, dict) or not isinstance(line.get("role"), str) or not isinstance(line.get("text"), str):
                raise ConfigError(self.path, n, "(line)", 'each line needs "role" and "text" strings')
            self.lines.append(line)
        # (episode id, role) -> (turn, attempt) of its last request, lines used
        self.cursors: dict[tuple[str, str], tuple[tuple[int, int], int]] = {}

    async def __call__(self, request: PolicyRequest) -> PolicyOutput:
        key = (request.episode, request.role)
        mine = [
            line for line in self.lines
            if line["role"] == request.role and line.get("episode", request.episode_index) == request.episode_index
        ]
        at = (request.turn, request.attempt)
        last, i = self.cursors.get(key, (at, 0))
        if at <= last:  # the episode's id played again (a training run's evaluations reuse theirs): from the start
            i = 0
        if i >= len(mine):
            raise PolicyError(f"replay file {self.path} has no more lines for role {request.role!r} ({len(mine)} used)")
        self.cursors[key] = (at, i + 1)
        return PolicyOutput(text=mine[i]["text"])
