"""``population``: several live learners, each its own LoRA adapter, matched against each other.

The game's players (``players``; default every trainable role) share one adapter in the recipe,
say ``player``; ``members: 4`` makes four learners ``player-0`` .. ``player-3`` from it (or list
their names). Each has its own training client and sampler dir, and the engine serves them all in
its mixed batches, so a population costs small adapters, not models.

Episode ``i`` of the run (counted over its steps) seats member ``i mod N`` (the focal member) in
the player seat ``(i div N) mod P``, so every member plays every seat equally often, in each step
where a step's episodes are a multiple of N x P, else over the steps; and fills the other seats
with one opponent drawn by ``matchmaking`` from the other members and the snapshot pool:

- ``uniform``: every candidate alike.
- ``elo``: weight exp(-|R_focal - R_opponent| / ``elo_scale``): mostly the nearest ratings.
- ``pfsp``: prioritised fictitious self-play (Vinyals et al. 2019) on the focal member's record
  against each candidate, p = (score + 1) / (games + 2) (a draw scores 1/2); ``pfsp_weighting``
  ``even`` weights p (1 - p), opponents it beats about half the time, ``hard`` weights (1 - p)^2,
  the ones that beat it.

A step's games are drawn as its rollout starts, from a generator seeded by (``seed``, step,
episode), with the ratings, records and pool as they stand then: trained synchronously, as at the
start of the step, so a resumed run draws the same matches; with ``max_staleness: K``, as K steps
before (the first K steps after a resume: as at the checkpoint, so they can differ). Every seat played by a
member trains that member; seats played by a snapshot train nothing. A member's advantage is its
reward minus the mean of its own rewards in the same group (GRPO's baseline, per member), divided
by their std with ``scale_std``. With many members a member may play once in a group and get a
zero advantage; ``baseline: step`` centres each member on all of its rewards in the step instead,
for games whose groups are alike (every task the same start, as in Rock-Paper-Scissors).

Members start as the base model (LoRA B = 0), so alike that in a game like Rock-Paper-Scissors
they collapse together; ``init_noise`` adds seeded noise of that std to each member's B first.

After each step every result (a draw scores 1/2) updates the Elo ratings (K = ``elo_k``) of both sides and
the pairwise records; every ``snapshot_every`` steps (0: never) one member, in turn, is frozen
into a pool of at most ``pool_size`` snapshots (the oldest leaves). Ratings, records, pool and
turn are in every checkpoint.
"""
from __future__ import annotations

import math
import random
import re
from typing import Any, Literal

from pydantic import Field

from orchestrator.config import ADAPTER_NAME_MAX, NAME_PATTERN, PluginConfig
from orchestrator.training.trainer import Rewards, Snapshot, Trainer, TrainerContext, centred
from orchestrator.transcript import EpisodeRecord

START_RATING = 1000.0


class Population(Trainer):
    class Config(PluginConfig):
        players: list[str] | None = Field(
            None, min_length=2, description="the roles that share the adapter; default: every trainable role")
        members: int | list[str] = Field(
            4, description="how many learners (named <adapter>-0..N-1), or their adapter names; two or more")
        matchmaking: Literal["uniform", "elo", "pfsp"] = Field("uniform", description="how opponents are drawn")
        pfsp_weighting: Literal["even", "hard"] = Field(
            "even", description="pfsp: p(1-p) towards even matches, or (1-p)^2 towards opponents that win")
        elo_scale: float = Field(200.0, gt=0.0, description="elo matchmaking: rating gap that cuts a weight by e")
        elo_k: float = Field(16.0, ge=0.0, description="Elo K-factor")
        snapshot_every: int = Field(0, ge=0, description="steps between a member joining the pool; 0 = no pool")
        pool_size: int = Field(5, ge=1, description="snapshots kept; the oldest leaves")
        scale_std: bool = Field(False, description="divide each member's centred rewards by their std")
        baseline: Literal["group", "step"] = Field(
            "group", description="centre a member's rewards on its own in the same group (same task), or in the "
                                 "whole step (for games whose tasks are all alike)")
        init_noise: float = Field(
            0.0, ge=0.0, description="std of noise added to each member's LoRA B at the start, so members start apart; "
                                     "0: all start as the base model")
        seed: int = Field(0, description="seeds the matchmaking draws")

        def model_post_init(self, _context: Any) -> None:
            count = self.members if isinstance(self.members, int) else len(set(self.members))
            if count < 2:
                raise ValueError("members: a population needs two or more distinct members")
            # a member is an adapter: a name with a dot or a slash broke PEFT and the sampler dir's path
            # (fullmatch: re.match's `$` passes a trailing newline, which went into the folder's name)
            if bad := [n for n in ([] if isinstance(self.members, int) else self.members)
                       if not re.fullmatch(NAME_PATTERN, n) or len(n) > ADAPTER_NAME_MAX]:
                raise ValueError(f"members: {bad[0]!r} is not an adapter name (it must match {NAME_PATTERN}, "
                                 f"in at most {ADAPTER_NAME_MAX} characters)")

    config: Config

    def __init__(self, context: TrainerContext):
        super().__init__(context)
        self.players: list[str] = list(self.config.players or context.adapters)
        shared = {context.adapters.get(p) for p in self.players}
        if len(self.players) < 2 or len(shared) != 1 or None in shared:  # one player: no seat for an opponent
            raise ValueError(f"population: the players {self.players} must be trainable roles sharing one adapter, two or more")
        if len(set(self.players)) != len(self.players):
            raise ValueError(f"population: the players must be different roles; got {self.players}")
        if others := [r for r in context.adapters if r not in self.players]:  # only members learn: these never would
            raise ValueError(f"population: {others} learn but are not players: make them players or trainable: false")
        base = shared.pop()
        m = self.config.members
        self.members: list[str] = [f"{base}-{i}" for i in range(m)] if isinstance(m, int) else list(dict.fromkeys(m))
        self.pool: list[str] = []
        self.rating: dict[str, float] = {name: START_RATING for name in self.members}
        self.record: dict[str, dict[str, list[float]]] = {}  # a -> b -> [a's score against b, games]
        self.snapshots_taken = 0
        # step -> episode index -> seat -> adapter; async training samples later steps before a step
        # is credited, and steps are credited in order, so advantages() takes the oldest
        self._seats: dict[int, dict[int, dict[str, str]]] = {}

    # -- who plays whom ----------------------------------------------------------------------
    def learners(self) -> list[str]:
        return list(self.members)

    def init_noise(self, adapter: str) -> float:
        return self.config.init_noise

    def focal(self, index: int, step: int = 1) -> tuple[str, str]:
        """(member, seat) that episode ``index`` of ``step`` is drawn for: counted over the run, as
        with six episodes a step, four members and two seats two members never sat in the second."""
        n = len(self.members)
        index += (step - 1) * self.context.episodes_per_step
        return self.members[index % n], self.players[(index // n) % len(self.players)]

    def weights(self, member: str, candidates: list[str]) -> list[float]:
        """Matchmaking weights of ``candidates`` as ``member``'s opponent."""
        rule = self.config.matchmaking
        if rule == "uniform":
            return [1.0] * len(candidates)
        if rule == "elo":  # less the nearest gap: far from them all, every exp() underflowed to 0 and choices() raised
            gaps = [abs(self.rating[member] - self.rating[c]) for c in candidates]
            return [math.exp(-(gap - min(gaps)) / self.config.elo_scale) for gap in gaps]
        out = []
        for c in candidates:
            score, games = self.record.get(member, {}).get(c, [0.0, 0])
            p = (score + 1) / (games + 2)
            out.append(p * (1 - p) if self.config.pfsp_weighting == "even" else (1 - p) ** 2)
        return out

    def match(self, step: int, index: int) -> dict[str, str]:
        """seat -> adapter for every player seat of episode ``index`` at ``step``."""
        member, seat = self.focal(index, step)
        candidates = [m for m in self.members if m != member] + self.pool
        rng = random.Random(f"{self.config.seed}:{step}:{index}")
        opponent = rng.choices(candidates, weights=self.weights(member, candidates))[0]
        return {p: member if p == seat else opponent for p in self.players}

    def adapters_for(self, step: int, index: int) -> dict[str, str]:
        seats = self._seats.setdefault(step, {})[index] = self.match(step, index)
        return dict(seats)

    def eval_adapters_for(self, index: int) -> dict[str, str]:
        """Evaluations seat the members in turn (the other seats: the next member, or whatever
        the recipe's evaluation opponent binds)."""
        n = len(self.members)
        return {p: self.members[(index + k) % n] for k, p in enumerate(self.players)}

    # -- credit ------------------------------------------------------------------------------
    def advantages(self, rewards: Rewards) -> Rewards:
        return self.step_advantages(rewards, [[True] * len(group) for group in rewards])

    def step_advantages(self, rewards: Rewards, finished: list[list[bool]]) -> Rewards:
        """Each member's seats centred together (within a group, or over the step), the seats
        of snapshots and of failed episodes left out: the seats are placed by position in the step."""
        out: Rewards = [[{} for _ in group] for group in rewards]
        step_seats = self._seats.pop(min(self._seats))
        places: list[tuple[int, int, str, str]] = []  # (group, episode in it, seat, member)
        members, index = set(self.members), 0
        for g, group in enumerate(rewards):
            for e in range(len(group)):
                seat = step_seats[index + e]
                if finished[g][e]:
                    places += [(g, e, p, seat[p]) for p in self.players if seat[p] in members]
                out[g][e] = {p: 0.0 for p in self.players}  # snapshot seats: no learner, no advantage
            index += len(group)
        pools: dict[tuple, list[tuple[int, int, str]]] = {}  # who is centred together
        for g, e, p, member in places:
            pools.setdefault((member, g if self.config.baseline == "group" else 0), []).append((g, e, p))
        for pool in pools.values():
            for (g, e, p), value in zip(pool, centred([rewards[g][e].get(p, 0.0) for g, e, p in pool], self.config.scale_std)):
                out[g][e][p] = value
        return out

    # -- after each step: ratings, records, snapshots -------------------------------------------
    def after_step(
        self, step: int, episodes: list[EpisodeRecord], rewards: list[dict[str, float]], snapshot: Snapshot
    ) -> dict[str, float]:
        played: dict[str, list[float]] = {m: [0.0, 0] for m in self.members}
        for ep, rw in zip(episodes, rewards):
            member, seat = self.focal(ep.index, step)
            opponent = next(a for p, a in ep.adapters.items() if p in self.players and p != seat)
            theirs = max(rw.get(p, 0.0) for p in self.players if p != seat)
            score = 1.0 if rw.get(seat, 0.0) > theirs else 0.5 if rw.get(seat, 0.0) == theirs else 0.0
            if opponent in self.rating:  # else a snapshot that left the pool while async training played it
                self.result(member, opponent, score)
            played[member][0] += score
            played[member][1] += 1
        metrics = {f"win_rate/{m}": s / n for m, (s, n) in played.items() if n}
        every = self.config.snapshot_every
        if every and step % every == 0:
            member = self.members[self.snapshots_taken % len(self.members)]
            name = f"{member}@{step}"
            snapshot(member, name)
            self.snapshots_taken += 1
            self.pool.append(name)
            self.rating[name] = self.rating[member]
            if len(self.pool) > self.config.pool_size:
                gone = self.pool.pop(0)
                self.rating.pop(gone)
                self.record.pop(gone, None)  # its own results too: else every checkpoint keeps every snapshot ever taken
                for row in self.record.values():
                    row.pop(gone, None)
        metrics.update({f"elo/{name}": r for name, r in self.rating.items()})
        return metrics

    def result(self, a: str, b: str, score: float) -> None:
        """``a`` scored ``score`` (1 win, 1/2 draw, 0 loss) against ``b``: Elo and records."""
        expected = 1.0 / (1.0 + 10 ** ((self.rating[b] - self.rating[a]) / 400))
        delta = self.config.elo_k * (score - expected)
        self.rating[a] += delta
        self.rating[b] -= delta
        for x, y, s in ((a, b, score), (b, a, 1.0 - score)):
            row = self.record.setdefault(x, {}).setdefault(y, [0.0, 0])
            row[0] += s
            row[1] += 1

    # -- checkpoints ---------------------------------------------------------------------------
    def opponent_adapters(self) -> list[str]:
        return list(self.pool)

    def state_dict(self) -> dict[str, Any]:
        return {"members": self.members, "pool": self.pool, "rating": self.rating, "record": self.record,
                "snapshots_taken": self.snapshots_taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["members"] != self.members:
            raise ValueError(f"population: the checkpoint's members {state['members']} are not {self.members}")
        self.pool = list(state["pool"])
        self.rating = dict(state["rating"])
        self.record = {a: {b: list(v) for b, v in row.items()} for a, row in state["record"].items()}
        self.snapshots_taken = int(state["snapshots_taken"])
