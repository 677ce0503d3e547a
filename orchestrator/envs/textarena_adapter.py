"""``textarena``: any TextArena game as a rolecast environment (extra ``games``).

    protocol:
      type: textarena
      env_id: TicTacToe-v0
      players: [p0, p1]          # one role per TextArena player, in player-id order
      moves: null                # fixed legal moves to offer, e.g. ["[rock]", "[paper]", "[scissors]"]
      env_kwargs: {}

A role sends ``{"move": "[4]"}``; the text goes to TextArena as the player's action, and
TextArena's own rules judge it (its invalid-move handling and rewards apply). Each role observes
its player's TextArena observation. ``legal_moves`` are the ``moves`` given here, else the
quoted bracketed moves the last "available/valid moves" line of the observation lists (as
TicTacToe-v0 prints them), else empty. Rewards are TextArena's final rewards; the results compare them.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from ..messages import Message
from .base import StepResult
from .game import GameConfig, GameEnv, require, results_by_score

MOVES_LINE = re.compile(r"(?:available|valid|legal) (?:moves|actions)[^\n]*", re.IGNORECASE)
QUOTED_MOVE = re.compile(r"'(\[[^\]'\n]+\])'")


class TextArenaConfig(GameConfig):
    env_id: str
    moves: list[str] | None = None
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    on_invalid: Literal["end"] = "end"

    @model_validator(mode="after")
    def _known_env(self) -> "TextArenaConfig":
        require("textarena")
        from textarena.envs.registration import ENV_REGISTRY

        if self.env_id not in ENV_REGISTRY:
            raise ValueError(f"unknown TextArena env_id {self.env_id!r}")
        return self


def listed_moves(observation: str) -> list[str]:
    lines = MOVES_LINE.findall(observation)
    return QUOTED_MOVE.findall(lines[-1]) if lines else []


class TextArenaEnv(GameEnv):
    Config = TextArenaConfig
    observation_keys = frozenset({"observation", "legal_moves", "player_id"})
    config: TextArenaConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import textarena

        self.env = textarena.make(env_id=self.config.env_id, **self.config.env_kwargs)
        # TextArena seeds Python's global `random` from this seed.
        self.env.reset(num_players=len(self.config.players), seed=self.rng.randrange(2**31))
        self.player_id, self.text = self.env.get_observation()

    def next_role(self) -> str | None:
        return None if self.done else self.config.players[self.player_id]

    def observe(self, role: str) -> dict[str, Any]:
        moves = self.config.moves or listed_moves(self.text)
        return {"observation": self.text.strip(), "legal_moves": moves, "player_id": self.player_id}

    async def step(self, role: str, message: Message) -> StepResult:
        if not message.valid:
            return self.forfeit(role, "invalid")
        done, _ = self.env.step(action=str(message.content.get("move", "")))
        if not done:
            self.player_id, self.text = self.env.get_observation()
            return StepResult()
        rewards, _ = self.env.close()  # where TextArena hands out the final rewards
        scores = {p: float((rewards or {}).get(i, 0.0)) for i, p in enumerate(self.config.players)}
        return self.finish(results_by_score(scores), scores, "game_over")

    async def close(self) -> None:
        self.env.close()
