"""``self-play``: players share one adapter and also face snapshots of their past selves.

Every ``snapshot_every`` steps (default 5) the current weights join an opponent pool of at most
``pool_size`` (default 5; the oldest leaves). In each episode one player, alternating by
episode, is the learner; its opponent is the live adapter itself with probability
``latest_prob`` (default 0.8), else a snapshot drawn from the pool, uniformly or, with
``sampling: win_rate``, in proportion to how often it beats the learner (w + 1) / (n + 2).
Against the live adapter both players' tokens train; against a snapshot only the learner's.
Each result updates an Elo table (K = ``elo_k``, default 16) kept for the learner ("latest")
and every snapshot. Advantages are GRPO's, per player, over the seats the live adapter held: a
seat a snapshot played is in no baseline and gets none (its reward says how the snapshot did).

Without a pool, self-play on a cyclic game (rock-paper-scissors) chases its own last strategy
round and round; old snapshots anchor it.
"""
from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field

from orchestrator.training.trainer import Rewards, Snapshot, TrainerContext, centred
from orchestrator.transcript import EpisodeRecord

from .grpo import GRPO


class SelfPlay(GRPO):
    class Config(GRPO.Config):
        players: list[str] | None = Field(
            None, min_length=2, description="the roles that share the adapter; default: every trainable role")
        snapshot_every: int = Field(5, ge=0, description="steps between snapshots joining the pool; 0 = none")
        pool_size: int = Field(5, ge=1, description="snapshots kept; the oldest leaves")
        latest_prob: float = Field(0.8, ge=0.0, le=1.0, description="chance an episode's opponent is the live adapter")
        sampling: Literal["uniform", "win_rate"] = Field("uniform", description="how a snapshot opponent is drawn")
        elo_k: float = Field(16.0, ge=0.0, description="Elo K-factor")
        seed: int = Field(0, description="seeds the opponent draws")

    config: Config

    def __init__(self, context: TrainerContext):
        super().__init__(context)
        self.players: list[str] = list(self.config.players or context.adapters)
        adapters = {context.adapters.get(p) for p in self.players}
        if len(set(self.players)) < 2 or len(adapters) != 1 or None in adapters:
            raise ValueError(f"self-play needs two or more trainable players sharing one adapter; got {self.players}")
        if len(set(self.players)) != len(self.players):
            raise ValueError(f"self-play players must be different roles; got {self.players}")
        self.adapter = adapters.pop()
        self.pool: list[str] = []
        self.record: dict[str, list[int]] = {}  # snapshot -> [snapshot wins, games] against the learner
        self.elo: dict[str, float] = {"latest": 1000.0}
        self._faced: dict[int, dict[int, str | None]] = {}  # step -> episode index -> the snapshot it faced

    # -- who plays whom ----------------------------------------------------------------------
    def learner(self, index: int) -> str:
        return self.players[index % len(self.players)]

    def opponent(self, step: int, index: int) -> str | None:
        """The snapshot the non-learners play in this episode, or None for the live adapter."""
        rng = random.Random(f"{self.config.seed}:{step}:{index}")
        if not self.pool or rng.random() < self.config.latest_prob:
            return None
        if self.config.sampling == "uniform":
            return rng.choice(self.pool)
        weights = [(self.record[n][0] + 1) / (self.record[n][1] + 2) for n in self.pool]
        return rng.choices(self.pool, weights=weights)[0]

    def adapters_for(self, step: int, index: int) -> dict[str, str]:
        snapshot = self._faced.setdefault(step, {})[index] = self.opponent(step, index)
        if snapshot is None:
            return {}
        return {p: snapshot for p in self.players if p != self.learner(index)}

    # -- credit ------------------------------------------------------------------------------
    def step_advantages(self, rewards: Rewards, finished: list[list[bool]]) -> Rewards:
        """Each role centred within its group over the finished episodes where the live adapter
        held its seat (against a snapshot, only the learner's seat)."""
        faced = self._faced.pop(min(self._faced)) if self._faced else {}
        out: Rewards = [[{role: 0.0 for role in rw} for rw in group] for group in rewards]
        index = 0
        for g, group in enumerate(rewards):
            for role in {r for rw in group for r in rw}:
                live = [e for e in range(len(group)) if finished[g][e] and (
                    role not in self.players or faced.get(index + e) is None or role == self.learner(index + e))]
                for e, value in zip(live, centred([group[e][role] for e in live], self.config.scale_std)):
                    out[g][e][role] = value
            index += len(group)
        return out

    # -- after each step: results, Elo, snapshots ----------------------------------------------
    def after_step(
        self, step: int, episodes: list[EpisodeRecord], rewards: list[dict[str, float]], snapshot: Snapshot
    ) -> dict[str, float]:
        wins = {"latest": [0, 0], "pool": [0, 0]}
        for ep, rw in zip(episodes, rewards):
            me = self.learner(ep.index)
            others = [p for p in self.players if p != me]
            opp = ep.adapters.get(others[0]) if others else None
            mine, theirs = rw.get(me, 0.0), max(rw.get(p, 0.0) for p in others)
            score = 1.0 if mine > theirs else 0.5 if mine == theirs else 0.0
            bucket = wins["pool" if opp else "latest"]
            bucket[0] += score
            bucket[1] += 1
            if opp in self.record:  # not a snapshot that left the pool while async training played it
                self._update_elo(opp, score)
        every = self.config.snapshot_every
        if every and step % every == 0:
            name = f"{self.adapter}@{step}"
            snapshot(self.adapter, name)
            self.pool.append(name)
            self.record[name] = [0, 0]
            self.elo[name] = self.elo["latest"]
            if len(self.pool) > self.config.pool_size:
                gone = self.pool.pop(0)
                self.record.pop(gone)
                self.elo.pop(gone)  # else every checkpoint keeps a rating for every snapshot ever taken
        out = {f"win_rate/vs_{k}": v[0] / v[1] for k, v in wins.items() if v[1]}
        out.update({f"elo/{k}": v for k, v in self.elo.items()})
        return out

    def _update_elo(self, snapshot: str, score: float) -> None:
        expected = 1.0 / (1.0 + 10 ** ((self.elo[snapshot] - self.elo["latest"]) / 400))
        self.elo["latest"] += self.config.elo_k * (score - expected)
        self.elo[snapshot] -= self.config.elo_k * (score - expected)
        self.record[snapshot][0] += int(score == 0.0)
        self.record[snapshot][1] += 1

    def opponent_adapters(self) -> list[str]:
        return list(self.pool)

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "record": self.record, "elo": self.elo}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool, self.record, self.elo = list(state["pool"]), dict(state["record"]), dict(state["elo"])
