"""Replay a JSONL file of ``{"role": ..., "text": ...}`` lines, in order per role.

Every episode replays the file from its start, so a run is the same whatever the concurrency;
lines with an ``"episode": N`` key are used only by the episode with that index.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..errors import ConfigError, PolicyError
from ..yamlfile import load_json_lines
from .base import PolicyOutput, PolicyRequest


class ReplayPolicy:
    MAX_CURSORS = 65536

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lines: list[dict] = []
        for n, line in load_json_lines(self.path):
            if not isinstance(line, dict) or not isinstance(line.get("role"), str) or not isinstance(line.get("text"), str):
                raise ConfigError(self.path, n, "(line)", 'each line needs "role" and "text" strings')
            index = line.get("episode", 0)  # "1", 1.5 or true had matched no episode, or episode 1, unsaid
            if type(index) is not int or index < 0:
                raise ConfigError(self.path, n, "episode", f"{index!r} is no episode index (a whole number from 0)")
            self.lines.append(line)
        # role -> its lines for every episode, and per episode index its own, each as (line number, line):
        # a request reads only its own, not the whole file (a file of every episode of a big run)
        self.by_role: dict[str, tuple[list, dict[Any, list]]] = {}
        for n, line in enumerate(self.lines):
            shared, own = self.by_role.setdefault(line["role"], ([], {}))
            (own.setdefault(line["episode"], []) if "episode" in line else shared).append((n, line))
        # (episode id, role) -> (turn, attempt) of its last request, lines used; the least recently
        # used go past MAX_CURSORS (far more than episodes in flight), else a long run's grow unbounded
        self.cursors: OrderedDict[tuple[str, str], tuple[tuple[int, int], int]] = OrderedDict()

    async def __call__(self, request: PolicyRequest) -> PolicyOutput:
        key = (request.episode, request.role)
        shared, own = self.by_role.get(request.role, ([], {}))
        mine = [line for _, line in heapq.merge(shared, own.get(request.episode_index, []))]  # in the file's order
        at = (request.turn, request.attempt)
        last, i = self.cursors.get(key, (at, 0))
        if at <= last:  # the episode's id played again (a training run's evaluations reuse theirs): from the start
            i = 0
        if i >= len(mine):
            raise PolicyError(f"replay file {self.path} has no more lines for role {request.role!r} ({len(mine)} used)")
        self.cursors[key] = (at, i + 1)
        self.cursors.move_to_end(key)
        if len(self.cursors) > self.MAX_CURSORS:
            self.cursors.popitem(last=False)
        return PolicyOutput(text=mine[i]["text"])
