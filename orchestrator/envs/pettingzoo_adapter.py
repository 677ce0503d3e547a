"""``pettingzoo``: any turn-based PettingZoo classic (AEC) environment as a rolecast environment.

    protocol:
      type: pettingzoo
      env: tictactoe_v3          # a classic game, family/name_vN or a registry id (classic/tictactoe-v3), or a module with env()
      players: [p1, p2]          # one role per agent, in `possible_agents` order
      env_kwargs: {}
      illegal_penalty: -1.0      # an action outside the action mask: the game ends

Observations become text: boards (``(rows, cols, 2)`` planes: yours, the opponent's) are drawn
with X for your pieces and O for the opponent's; other observations are listed as numbers. Legal
moves are the action ids the action mask allows (every action when there is no mask); a role sends
``{"move": "4"}``. Chess and Go are drawn from their own state and moved in their own notation
(``pettingzoo_boards``): ``{"move": "e2e4"}``, ``{"move": "d4"}``. Rewards are PettingZoo's, summed
per agent; the results compare the totals, except in a game that paid every agent alike every
time (cooperative, such as Hanabi): there the shared total decides, positive a win for all.
"""
from __future__ import annotations

import importlib
import re
from typing import Any, Literal

from pydantic import Field, model_validator

from ..messages import Message
from .base import StepResult
from .game import GameConfig, GameEnv, move_of, require, results_by_score
from .pettingzoo_boards import BOARDS, View

# How each known game's actions read, and whether its board planes are stored column-major.
HINTS = {
    "tictactoe_v3": ("Squares are numbered down the columns: 0 3 6 / 1 4 7 / 2 5 8.", True),
    "connect_four_v3": ("A move is the column to drop a disc in, 0 (left) to 6 (right).", False),
}


class PettingZooConfig(GameConfig):
    env: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    on_invalid: Literal["end"] = "end"

    @model_validator(mode="after")
    def _agents_match(self) -> "PettingZooConfig":
        try:
            env = make_env(self.env, self.env_kwargs)
        except TypeError as exc:  # an env_kwargs key the game does not take: one line, not a traceback
            raise ValueError(f"{self.env}: {exc}") from None
        except (ValueError, AssertionError):  # pydantic words these itself
            raise
        except Exception as exc:  # a dependency the game lacks, a user's env() that fails: one line too
            raise ValueError(f"{self.env}: {type(exc).__name__}: {exc}") from None
        agents = env.possible_agents
        env.close()
        if len(agents) != len(self.players):
            raise ValueError(f"{self.env} has {len(agents)} agents ({', '.join(agents)}); `players` names {len(self.players)} roles")
        return self


def registry_id(name: str) -> str:
    """tictactoe_v3, classic/tictactoe_v3 and classic/tictactoe-v3 all name classic/tictactoe-v3."""
    family, _, game = name.rpartition("/")
    game = re.sub(r"_v(\d+)$", r"-v\1", game)
    return f"{family or 'classic'}/{game}"


def make_env(name: str, kwargs: dict[str, Any]) -> Any:
    """An AEC env from the registry (PettingZoo >= 1.27, which deprecates the module API) or a module."""
    pettingzoo = require("pettingzoo")
    registry = getattr(pettingzoo, "aec_registry", None)
    if "." in name:
        return module_env(name, kwargs)
    env_id = registry_id(name)
    if registry is None:  # older PettingZoo: classic/tictactoe-v3 -> pettingzoo.classic.tictactoe_v3
        return module_env("pettingzoo." + re.sub(r"-v(\d+)$", r"_v\1", env_id).replace("/", "."), kwargs)
    if env_id not in registry:
        raise ValueError(f"unknown PettingZoo env {name!r} (registry id {env_id!r})")
    return pettingzoo.make("aec", env_id, **kwargs)


def module_env(module_name: str, kwargs: dict[str, Any]) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # a user's module, or a game this PettingZoo lacks: no extra installs it
        raise ValueError(f"cannot import the env module {module_name} ({exc}): is it on PYTHONPATH?") from None
    if not callable(getattr(module, "env", None)):
        raise ValueError(f"{module.__name__} has no env() constructor")
    return module.env(**kwargs)


def game_key(env_name: str) -> str:
    """tictactoe_v3 for tictactoe_v3, classic/tictactoe-v3 and pettingzoo.classic.tictactoe_v3."""
    return re.split(r"[./]", env_name)[-1].replace("-v", "_v")


def render_observation(obs: Any, env_name: str) -> str:
    import numpy as np  # here, not at the top: every command imports this module, few play PettingZoo

    array = np.asarray(obs["observation"] if isinstance(obs, dict) else obs)
    hint, transpose = HINTS.get(game_key(env_name), ("", False))
    if array.ndim == 3 and array.shape[2] == 2:
        planes = array.transpose(1, 0, 2) if transpose else array
        rows = [" ".join("X" if cell[0] else "O" if cell[1] else "." for cell in row) for row in planes]
        text = "Board (X: yours, O: your opponent's):\n" + "\n".join(rows)
    else:
        text = f"Observation: {array.tolist()}"
    return f"{text}\n{hint}".strip()


class PettingZooEnv(GameEnv):
    Config = PettingZooConfig
    observation_keys = frozenset({"observation", "legal_moves", "agent"})
    move_field = "move"
    config: PettingZooConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.env = make_env(self.config.env, self.config.env_kwargs)
        self.env.reset(seed=self.rng.randrange(2**31))
        self.roles_of = dict(zip(self.env.possible_agents, self.config.players))
        self.totals = {p: 0.0 for p in self.config.players}
        self.shared = True  # every reward so far paid to all agents alike
        self.board_view = BOARDS.get(game_key(self.config.env))
        self._advance()

    def _collect(self) -> dict[str, float]:
        self.shared = self.shared and len(set(self.env.rewards.values())) <= 1
        paid = {self.roles_of[a]: float(r) for a, r in self.env.rewards.items() if r}
        for p, value in paid.items():
            self.totals[p] += value
        return paid

    def _advance(self) -> dict[str, float]:
        """Step agents that are done (PettingZoo wants a None action from each) until one must act."""
        paid: dict[str, float] = {}
        while self.env.agents:
            _, _, terminated, truncated, _ = self.env.last()
            if not (terminated or truncated):
                return paid
            agents = len(self.env.agents)
            self.env.step(None)
            if len(self.env.agents) >= agents:  # a loop without end, which no episode timeout stops (it never awaits)
                raise RuntimeError(f"{self.config.env}: agent {self.env.agent_selection!r} is done, and its None "
                                   f"step left it in the game (PettingZoo's rule, which its api_test checks: "
                                   f"a done agent's step removes it, as _was_dead_step does)")
            for p, value in self._collect().items():
                paid[p] = paid.get(p, 0.0) + value
        return paid

    def view(self) -> View:
        """The acting agent's observation as text, and its legal moves by name."""
        agent = self.env.agent_selection
        obs = self.env.observe(agent)
        if isinstance(obs, dict) and "action_mask" in obs:
            legal = [i for i, allowed in enumerate(obs["action_mask"]) if allowed]
        else:
            legal = list(range(self.env.action_space(agent).n))
        if self.board_view is not None:
            return self.board_view(self.env.unwrapped, agent, legal)
        return render_observation(obs, self.config.env), {str(i): i for i in legal}

    def next_role(self) -> str | None:
        return None if self.done or not self.env.agents else self.roles_of[self.env.agent_selection]

    def observe(self, role: str) -> dict[str, Any]:
        text, moves = self.view()
        return {"observation": text, "legal_moves": list(moves), "agent": self.env.agent_selection}

    async def step(self, role: str, message: Message) -> StepResult:
        if not message.valid:
            return self.forfeit(role, "invalid")
        action = self.view()[1].get(move_of(message))
        if action is None:
            return self.forfeit(role, "illegal")
        self.env.step(action)
        paid = self._collect()
        for p, value in self._advance().items():
            paid[p] = paid.get(p, 0.0) + value
        if not self.env.agents:
            return self.finish(results_by_score(self.totals, self.shared), paid, "game_over")
        return StepResult(rewards=paid)

    def outcome(self) -> dict[str, Any]:
        return {**super().outcome(), "totals": self.totals}

    async def close(self) -> None:
        self.env.close()
