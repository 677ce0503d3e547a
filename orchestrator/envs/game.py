"""What the games share: named players, an opponent for ``rolecast eval``, illegal moves, results.

Every game reports ``outcome()["results"]``: ``{role: "win" | "draw" | "loss"}`` for the roles
that play, which is what ``rolecast eval`` counts. A valid message whose move the rules forbid
(an occupied square, an action that is not on offer) costs the mover ``illegal_penalty`` and ends
the game; the mover's result is a loss, the others' a win (a reward of 0: they did nothing).
"""
from __future__ import annotations

import importlib
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from ..messages import Message
from ..yamlfile import Loc
from .base import Env, EnvConfig, Options, StepResult

Result = Literal["win", "draw", "loss"]


class WinLossRewards(Options):
    win: float = 1.0
    loss: float = -1.0
    draw: float = 0.0


class GameConfig(EnvConfig):
    players: list[str] = Field(min_length=1, description="role names, in playing order")
    # The role `rolecast eval --opponent` rebinds; games with a fixed counterpart leave it None.
    opponent: str | None = None
    illegal_penalty: float = Field(-1.0, description="reward for a valid message whose move is illegal")
    # why a game never pays illegal_penalty (it has no illegal move, or judges them itself): then
    # setting it is refused, not ignored without a word
    no_illegal_penalty: ClassVar[str] = ""

    @model_validator(mode="after")
    def _check_players(self) -> "GameConfig":
        # by value: a config dumped whole (config.yaml, a worker's copy) gives the default back
        if self.no_illegal_penalty and self.illegal_penalty != type(self).model_fields["illegal_penalty"].default:
            raise ValueError(f"illegal_penalty is not used here: {self.no_illegal_penalty}")
        if len(set(self.players)) != len(self.players):
            raise ValueError("players must be different roles")
        roles = [name for _, name in self.role_refs()]
        if self.opponent is not None and self.opponent not in roles:
            raise ValueError(f"opponent {self.opponent!r} is not one of this game's roles {roles}")
        return self

    def role_refs(self) -> list[tuple[Loc, str]]:
        return [(("players", i), name) for i, name in enumerate(self.players)]

    def opponent_role(self) -> str | None:
        """The role ``rolecast eval --opponent`` rebinds (None: the game has no such role)."""
        return self.opponent


class TwoPlayerConfig(GameConfig):
    players: list[str] = Field(["first", "second"], min_length=2, max_length=2)
    # One move per turn: there is nothing sensible to do with a turn that carried no move.
    on_invalid: Literal["end"] = "end"

    def opponent_role(self) -> str | None:
        return self.opponent or self.players[1]


def move_of(message: Message, field: str = "move") -> str:
    """The move a valid message carries, normalised for comparison with legal moves."""
    return str((message.content or {}).get(field, "")).strip().lower()


class GameEnv(Env):
    """Base of the games: tracks ``done`` and the per-role results."""

    config: GameConfig
    # the field of a player's message its move is read from (move_of), declared by reads(); None
    # for a game that reads other fields, and says so in its own reads()
    move_field: ClassVar[str | None] = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.done = False
        self.results: dict[str, Result] | None = None
        self.reason: str | None = None

    @classmethod
    def reads(cls, config: GameConfig, role: str) -> dict[str, list[Any] | None]:
        # a player without it (another protocol's schema) lost every game on its first turn, as illegal
        return {cls.move_field: None} if cls.move_field and role in config.players else {}

    def finish(self, results: dict[str, Result], rewards: dict[str, float], reason: str) -> StepResult:
        self.done, self.results, self.reason = True, results, reason
        return StepResult(rewards=rewards, done=True, info={"reason": reason})

    def forfeit(self, role: str, reason: str) -> StepResult:
        """``role`` broke the rules (illegal move) or sent no move (invalid message): it loses.

        An invalid message already cost the role its ``invalid_penalty`` in the episode loop, so
        only an illegal move adds the env's ``illegal_penalty``.
        """
        results: dict[str, Result] = {p: ("loss" if p == role else "win") for p in self.config.players}
        # the winners' 0 is paid, not left out: one that had yet to move took part all the same, and
        # its mean reward (eval's, training's) is over the games its win is counted in
        rewards = {p: 0.0 for p in self.config.players if p != role}
        if reason == "illegal":
            rewards[role] = self.config.illegal_penalty
        return self.finish(results, rewards, reason)

    def outcome(self) -> dict[str, Any]:
        return {"results": self.results, "reason": self.reason}


def results_by_score(scores: dict[str, float], shared: bool = False) -> dict[str, Result]:
    """Highest score wins; a top score every player shares is a draw, one that only some share a
    win for each of them (TextArena's winning side of three or more players: +1 each). Alone, a
    player wins with a positive score and loses with a negative one; so do the players of a
    ``shared`` game (cooperative: every reward paid to all alike), which win or lose together."""
    if len(scores) == 1 or shared:
        return {p: ("win" if s > 0 else "draw" if s == 0 else "loss") for p, s in scores.items()}
    best = max(scores.values())
    tied = all(s == best for s in scores.values())
    return {p: ("loss" if s < best else "draw" if tied else "win") for p, s in scores.items()}


def require(module: str) -> Any:
    """Import an optional game suite, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"{module} is not installed ({exc}): pip install 'rolecast[games]'") from None
