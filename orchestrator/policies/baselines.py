"""Reference policies for the games: ``builtin:random``, ``builtin:minimax``, ``builtin:binary-search``.

They act from the structured view an environment gives a role (``PolicyRequest.context``), never
from the prompt text, and draw their randomness from the request's seed, so runs replay exactly.

- ``random``: a uniformly random legal move when the view has ``legal_moves``; otherwise a random
  instance of the role's schema (enums uniformly, integers in the view's ``low``..``high`` or the
  schema's bounds, strings a random common noun: a random guess in Twenty Questions).
- ``minimax``: perfect Tic-Tac-Toe from ``board`` and ``mark`` (ties between best moves at random).
- ``binary-search``: Guess the Number from ``low``, ``high`` and the ``history`` of feedback.
"""
from __future__ import annotations

import json
import random
from functools import lru_cache
from typing import Any

from ..envs.tictactoe import CELLS, EMPTY, winner
from ..errors import PolicyError
from ..role import RoleSpec
from .base import PolicyRequest
from .instances import random_instance


def move_field(schema: dict[str, Any], kind: str = "string", default: str = "move") -> str:
    """The schema's first required property of type ``kind``: where a move goes."""
    props = schema.get("properties", {})
    return next((name for name in schema.get("required", []) if props.get(name, {}).get("type") == kind), default)


def _needs(context: dict[str, Any], keys: tuple[str, ...], policy: str) -> None:
    missing = [k for k in keys if k not in context]
    if missing:
        raise PolicyError(f"builtin:{policy} needs the environment to provide {', '.join(missing)}: wrong game?")


class RandomPolicy:
    def __init__(self, spec: RoleSpec):
        self.schema = spec.schema
        self.field = move_field(spec.schema)

    async def __call__(self, request: PolicyRequest) -> str:
        rng = random.Random(request.seed)
        moves = request.context.get("legal_moves")
        if moves:
            return json.dumps({self.field: rng.choice(moves)})
        return json.dumps(random_instance(self.schema, request.context, rng))


@lru_cache(maxsize=None)
def _value(board: tuple[str, ...], mark: str) -> int:
    """Negamax value for the player ``mark`` to move: 1 win, 0 draw, -1 loss."""
    if winner(board) is not None:  # the previous mover completed a line
        return -1
    if EMPTY not in board:
        return 0
    other = "O" if mark == "X" else "X"
    return max(-_value(board[:i] + (mark,) + board[i + 1:], other) for i, v in enumerate(board) if v == EMPTY)


def best_moves(board: tuple[str, ...], mark: str) -> list[str]:
    other = "O" if mark == "X" else "X"
    scores = {i: -_value(board[:i] + (mark,) + board[i + 1:], other) for i, v in enumerate(board) if v == EMPTY}
    best = max(scores.values())
    return [CELLS[i] for i, s in scores.items() if s == best]


class MinimaxPolicy:
    def __init__(self, spec: RoleSpec):
        self.field = move_field(spec.schema)

    async def __call__(self, request: PolicyRequest) -> str:
        _needs(request.context, ("board", "mark"), "minimax")
        moves = best_moves(tuple(request.context["board"]), request.context["mark"])
        return json.dumps({self.field: random.Random(request.seed).choice(moves)})


def next_guess(low: int, high: int, history: list[dict[str, Any]]) -> int:
    """The middle of the interval the feedback so far leaves open."""
    for h in history:
        if h["feedback"] == "too high":
            high = min(high, h["guess"] - 1)
        elif h["feedback"] == "too low":
            low = max(low, h["guess"] + 1)
    return (low + high) // 2


class BinarySearchPolicy:
    def __init__(self, spec: RoleSpec):
        self.field = move_field(spec.schema, "integer", "guess")

    async def __call__(self, request: PolicyRequest) -> str:
        _needs(request.context, ("low", "high", "history"), "binary-search")
        c = request.context
        return json.dumps({self.field: next_guess(c["low"], c["high"], c["history"])})
