"""``self-play``: players share one adapter and also face snapshots of their past selves.

Every ``snapshot_every`` steps (default 5) the current weights join an opponent pool of at most
``pool_size`` (default 5; the oldest leaves). In each episode one player, alternating by
episode, is the learner; its opponent is the live adapter itself with probability
``latest_prob`` (default 0.8), else a snapshot drawn from the pool, uniformly or, with
``sampling: win_rate``, in proportion to how often it beats the learner (w + 1) / (n + 2).
Against the live adapter both players' tokens train; against a snapshot only the learner's.
Each result updates an Elo table (K = ``elo_k``, default 16) kept for the learner ("latest")
and every snapshot. Advantages are GRPO's, per player.

Without a pool, self-play on a cyclic game (rock-paper-scissors) chases its own last strategy
round and round; old snapshots anchor it.
"""
from __future__ import annotations

import random
from typing import Any

from orchestrator.training.trainer import TrainerContext

from .grpo import GRPO


class SelfPlay(GRPO):
    def __init__(self, context: TrainerContext):
        super().__init__(context)
        cfg = context.config
        self.players: list[str] = list(cfg.get("players") or context.adapters)
        adapters = {context.adapters.get(p) for p in self.players}
        if len(self.players) < 2 or len(adapters) != 1 or None in adapters:
            raise ValueError(f"self-play needs two or more trainable players sharing one adapter; got {self.players}")
        self.adapter = adapters.pop()
        self.snapshot_every = int(cfg.get("snapshot_every", 5))
        self.pool_size = int(cfg.get("pool_size", 5))
        self.latest_prob = float(cfg.get("latest_prob", 0.8))
        self.sampling = cfg.get("sampling", "uniform")
        if self.sampling not in ("uniform", "win_rate"):
            raise ValueError("self-play: sampling must be 'uniform' or 'win_rate'")
        self.k = float(cfg.get("elo_k", 16.0))
        self.seed = int(cfg.get("seed", 0))
        self.pool: list[str] = []
        self.record: dict[str, list[int]] = {}  # snapshot -> [snapshot wins, games] against the learner
        self.elo: dict[str, float] = {"latest": 1000.0}

    # -- who plays whom ----------------------------------------------------------------------
    def learner(self, index: int) -> str:
        return self.players[index % len(self.players)]

    def opponent(self, step: int, index: int) -> str | None:
        """The snapshot the non-learners play in this episode, or None for the live adapter."""
        rng = random.Random(f"{self.seed}:{step}:{index}")
        if not self.pool or rng.random() < self.latest_prob:
            return None
        if self.sampling == "uniform":
            return rng.choice(self.pool)
        weights = [(self.record[n][0] + 1) / (self.record[n][1] + 2) for n in self.pool]
        return rng.choices(self.pool, weights=weights)[0]

    def adapters_for(self, step: int, index: int) -> dict[str, str]:
        snapshot = self.opponent(step, index)
        if snapshot is None:
            return {}
        return {p: snapshot for p in self.players if p != self.learner(index)}

    # -- after each step: results, Elo, snapshots ----------------------------------------------
    def after_step(self, step: int, episodes: list, rewards: list[dict[str, float]], snapshot) -> dict[str, Any]:
        """``episodes``/``rewards`` flat in rollout order; ``snapshot(adapter, name)`` copies the
        adapter's live weights into the engine under ``name``."""
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
            if opp:
                self._update_elo(opp, score)
        if self.snapshot_every and step % self.snapshot_every == 0:
            name = f"{self.adapter}@{step}"
            snapshot(self.adapter, name)
            self.pool.append(name)
            self.record[name] = [0, 0]
            self.elo[name] = self.elo["latest"]
            if len(self.pool) > self.pool_size:
                self.record.pop(self.pool.pop(0))
        out = {f"win_rate/vs_{k}": v[0] / v[1] for k, v in wins.items() if v[1]}
        out.update({f"elo/{k}": v for k, v in self.elo.items() if k == "latest" or k in self.pool})
        return out

    def _update_elo(self, snapshot: str, score: float) -> None:
        expected = 1.0 / (1.0 + 10 ** ((self.elo[snapshot] - self.elo["latest"]) / 400))
        self.elo["latest"] += self.k * (score - expected)
        self.elo[snapshot] -= self.k * (score - expected)
        self.record[snapshot][0] += int(score == 0.0)
        self.record[snapshot][1] += 1

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "record": self.record, "elo": self.elo}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool, self.record, self.elo = list(state["pool"]), dict(state["record"]), dict(state["elo"])
