"""Helpers for the game tests: load a recipe with protocol overrides, play it with scripted,
recording or builtin policies, no model."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from orchestrator.policies.base import PolicyRequest
from orchestrator.policies.binding import Binding
from orchestrator.policies.python import PythonPolicy
from orchestrator.rollout import RunOptions, RunResult, build_policies, run_team
from orchestrator.team import Team, load_team
from support import no_engine

ROOT = Path(__file__).resolve().parents[2]


def team(recipe: str, tasks: list[dict] | None = None, **protocol: Any) -> Team:
    t = load_team(ROOT / "recipes" / f"{recipe}.yaml")
    if protocol:
        data = {**t.env_config.model_dump(), **protocol}
        t = dataclasses.replace(t, env_config=t.env_class.Config.model_validate(data))
    return dataclasses.replace(t, tasks=tasks) if tasks else t


def another_shape(tmp_path: Path, recipe: str, role: str, other: str) -> Path:
    """A copy of ``recipe`` whose ``role`` is played by the library role ``other``: another
    protocol's schema, which the env's ``reads`` must refuse at load."""
    text = (ROOT / "recipes" / f"{recipe}.yaml").read_text()
    swapped = re.sub(rf"  - use: \w+\n    name: {role}\n|  - use: {role}\n", f"  - use: {other}\n    name: {role}\n", text)
    assert swapped != text, f"no role {role!r} in {recipe}.yaml"
    path = tmp_path / "team.yaml"
    path.write_text(swapped)
    return path


def no_move_field(tmp_path: Path, protocol: str) -> Path:
    """A team of ``protocol`` (players p0, p1) whose p0 is an own role that names its move
    ``square``: another shape, which the env's ``reads`` must refuse at load."""
    path = tmp_path / "team.yaml"
    path.write_text(f"""name: t
protocol: {protocol}
roles:
  - use: game_player
    name: p0
    reply_prefix: ""
    output_schema: {{type: object, properties: {{square: {{type: string}}}}, required: [square]}}
  - {{use: game_player, name: p1}}
tasks: [{{}}]
""")
    return path


def any_move(t: Team) -> Team:
    """The team with the library game_player's schema (any move string) for every role, so moves the
    recipe's enum would refuse reach the environment, which must call them illegal."""
    from orchestrator.role import LIBRARY_DIR, load_role

    schema = load_role(LIBRARY_DIR / "game_player.yaml").schema
    return dataclasses.replace(t, roles={n: dataclasses.replace(s, schema=schema) for n, s in t.roles.items()})


def play(t: Team, policies: dict[str, str | Callable], tmp_path: Path, episodes: int = 1, seed: int = 0,
         concurrency: int = 16) -> RunResult:
    """``policies``: role -> "builtin:NAME" or a Python callable (every role must be bound)."""
    # Python-bound roles get a stub binding first, so no role falls back to the model.
    bindings = {r: Binding("builtin", p.partition(":")[2] if isinstance(p, str) else "stub") for r, p in policies.items()}
    bound = build_policies(t, bindings, no_engine)
    bound.update({r: PythonPolicy(p) for r, p in policies.items() if not isinstance(p, str)})
    options = RunOptions(episodes=episodes, seed=seed, out_dir=tmp_path / f"run-{len(list(tmp_path.iterdir()))}",
                         progress=False, concurrency=concurrency)
    return asyncio.run(run_team(t, bound, options))


class Script:
    """Replies with ``texts`` in order, per episode (dicts are sent as JSON); records requests."""

    def __init__(self, *texts: str | dict):
        self.texts = [t if isinstance(t, str) else json.dumps(t) for t in texts]
        self.cursor: dict[str, int] = defaultdict(int)
        self.requests: list[PolicyRequest] = []

    def __call__(self, request: PolicyRequest) -> str:
        self.requests.append(request)
        i = self.cursor[request.episode]
        self.cursor[request.episode] += 1
        return self.texts[i]


def moves(*values: str, field: str = "move") -> Script:
    return Script(*({field: v} for v in values))
