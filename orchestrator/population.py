"""A population's round robin: every pair of entrants (trained members, their frozen snapshots,
builtin baselines) plays the same number of games, half in each seat (``schedule``); from the games come the
payoff matrix, Bradley-Terry ratings with bootstrap intervals, and the 3-cycles of the win graph
(``rolecast eval RECIPE --population RUN_DIR``; ``rolecast report`` draws the heatmap).

- payoff[a][b]: a's mean environment reward in its games against b (antisymmetric in a zero-sum
  game); score[a][b]: a's share of points (win 1, draw 1/2) in them.
- ratings: Bradley-Terry strengths fitted to every game's points by the MM algorithm (Hunter
  2004), with one virtual draw per pair played so that an unbeaten entrant gets a finite rating,
  on the Elo scale (400 log10) with the entrants' mean at 1000; the 95% interval is the 2.5-97.5
  percentile band of fits to games resampled with replacement; an entrant with no finished game
  has none (``elo`` and ``ci95`` null).
- non-transitivity: a beats b when score[a][b] > 1/2; a 3-cycle is a beats b beats c beats a. A
  population that has learnt a transitive order has none; rock-paper-scissors at its best has many.
"""
from __future__ import annotations

import itertools
import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import RunFailed
from .policies.binding import Binding
from .registry import Registry
from .rollout import RunOptions, build_policies, run_team
from .team import Team

ANCHOR = 1000.0


@dataclass(frozen=True)
class Entrant:
    """One player of the round robin: an adapter the engine serves, or a builtin policy."""

    name: str
    adapter: str | None = None
    builtin: str | None = None


@dataclass(frozen=True)
class Game:
    a: str
    b: str
    reward_a: float
    reward_b: float

    @property
    def points_a(self) -> float:
        return 1.0 if self.reward_a > self.reward_b else 0.5 if self.reward_a == self.reward_b else 0.0


def schedule(entrants: list[Entrant], seats: list[str], games: int) -> list[dict[str, Entrant]]:
    """seat -> entrant for every game: each pair ``games`` times, alternating who sits first. With
    an odd number the odd game's first seat alternates from pair to pair: the earlier entrant of
    every pair had always had it, a first-move edge for whoever is listed first."""
    first, second = seats[0], seats[1]
    out = []
    for p, (a, b) in enumerate(itertools.combinations(entrants, 2)):
        for k in range(games):
            out.append({first: a, second: b} if (k + p) % 2 == 0 else {first: b, second: a})
    return out


async def play_round_robin(
    team: Team, seats: list[str], entrants: list[Entrant], engine: Any, games: int, *,
    seed: int, out_dir: Path, concurrency: int, timeout: float | None = None, registry: Registry | None = None,
    progress: bool = False,
) -> list[Game]:
    """Play the schedule: one run per arrangement of builtin seats (each run's policies bind those
    seats), adapters set per episode, so all adapter-vs-adapter games share the engine's batches."""
    by_bindings: dict[tuple, list[dict[str, Entrant]]] = defaultdict(list)
    for match in schedule(entrants, seats, games):
        by_bindings[tuple((s, e.builtin) for s, e in match.items() if e.builtin)].append(match)
    played: list[Game] = []
    records = []
    for k, (builtins, matches) in enumerate(sorted(by_bindings.items())):
        overrides = {s: Binding("builtin", name) for s, name in builtins}
        policies = build_policies(team, overrides, lambda: engine, registry)
        result = await run_team(team, policies, RunOptions(
            episodes=len(matches), seed=seed, out_dir=out_dir / f"games-{k:02d}", concurrency=concurrency,
            episode_timeout_s=timeout or team.config.episode_timeout_s, progress=progress,
            adapters_for=lambda i, m=matches: {s: e.adapter for s, e in m[i].items() if e.adapter},
            extra={"round_robin": {s: e.name for s, e in matches[0].items() if e.builtin}},
        ))
        records += result.episodes
        for record, match in zip(result.episodes, matches):
            if record.status != "ok":
                continue
            a_seat, b_seat = seats[0], seats[1]
            played.append(Game(match[a_seat].name, match[b_seat].name,
                               record.rewards.get(a_seat, 0.0), record.rewards.get(b_seat, 0.0)))
    if not played:  # ratings of no games would read as a result: every entrant level at 1000
        error = next((f"; the first error: {r.error}" for r in records if r.error), "")
        raise RunFailed(f"no game of the round robin finished ({dict(Counter(r.status for r in records))}){error} "
                        f"(transcripts in {out_dir})")
    return played


def matrices(names: list[str], games: list[Game]) -> dict[str, dict[str, dict[str, float | None]]]:
    """payoff, score and games played, each as matrix[a][b] (None where a and b never met)."""
    reward: dict[tuple[str, str], list[float]] = defaultdict(list)
    points: dict[tuple[str, str], list[float]] = defaultdict(list)
    for g in games:
        reward[g.a, g.b].append(g.reward_a)
        reward[g.b, g.a].append(g.reward_b)
        points[g.a, g.b].append(g.points_a)
        points[g.b, g.a].append(1.0 - g.points_a)

    def table(values: dict[tuple[str, str], list[float]], fn) -> dict[str, dict[str, float | None]]:
        return {a: {b: (fn(values[a, b]) if values.get((a, b)) else None) for b in names} for a in names}

    return {"payoff": table(reward, lambda v: round(sum(v) / len(v), 4)),
            "score": table(points, lambda v: round(sum(v) / len(v), 4)),
            "games": table(points, len)}


def bradley_terry(names: list[str], games: list[Game], iterations: int = 500) -> dict[str, float]:
    """Elo-scale ratings (mean ``ANCHOR``) fitted to the games' points, one virtual draw per pair."""
    wins: dict[str, float] = {n: 0.0 for n in names}
    meetings: dict[str, dict[str, float]] = {n: defaultdict(float) for n in names}
    for g in games:
        wins[g.a] += g.points_a
        wins[g.b] += 1.0 - g.points_a
        meetings[g.a][g.b] += 1
        meetings[g.b][g.a] += 1
    for a in names:  # the prior: one drawn game between every pair that met
        for b in meetings[a]:
            meetings[a][b] += 1
            wins[a] += 0.5
    strength = {n: 1.0 for n in names}
    for _ in range(iterations):
        new = {}
        for a in names:
            denom = sum(k / (strength[a] + strength[b]) for b, k in meetings[a].items())
            new[a] = wins[a] / denom if denom else strength[a]
        mean_log = sum(math.log(v) for v in new.values()) / len(new)
        new = {n: v / math.exp(mean_log) for n, v in new.items()}
        done = max(abs(math.log(new[n] / strength[n])) for n in names) < 1e-9
        strength = new
        if done:
            break
    return {n: ANCHOR + 400 * math.log10(s) for n, s in strength.items()}


def ratings_with_intervals(names: list[str], games: list[Game], resamples: int = 200, seed: int = 0) -> dict[str, dict]:
    # an entrant none of whose games finished (a baseline that cannot play this game) is not rated:
    # it kept its start, read as a rating of about 1000 with a narrow interval, and moved the others' mean
    rated = [n for n in names if any(n in (g.a, g.b) for g in games)]
    if not rated:
        return {n: {"elo": None, "ci95": None} for n in names}
    point = bradley_terry(rated, games)
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {n: [] for n in rated}
    for _ in range(resamples if games else 0):
        sample = [rng.choice(games) for _ in games]
        # only those the resample has a game of: one with none kept a rating of no game in its
        # interval (its start, moved by the others' mean) and moved the others' mean
        fit = bradley_terry([n for n in rated if any(n in (g.a, g.b) for g in sample)], sample, iterations=200)
        for n, r in fit.items():
            draws[n].append(r)
    out: dict[str, dict] = {n: {"elo": None, "ci95": None} for n in names}
    for n in rated:
        ds = sorted(draws[n])
        ci = [round(ds[int(0.025 * (len(ds) - 1))], 1), round(ds[int(0.975 * (len(ds) - 1))], 1)] if ds else None
        out[n] = {"elo": round(point[n], 1), "ci95": ci}
    return out


def three_cycles(names: list[str], score: dict[str, dict[str, float | None]]) -> tuple[list[list[str]], int]:
    """(every a > b > c > a cycle, once each, in ``names`` order of its first member; the number of
    triads whose three pairs all have a winner)."""
    def beats(a: str, b: str) -> bool:
        s = score[a][b]
        return s is not None and s > 0.5

    cycles, decided = [], 0
    for a, b, c in itertools.combinations(names, 3):
        pairs = [(a, b), (b, c), (a, c)]
        if all(score[x][y] is not None and score[x][y] != 0.5 for x, y in pairs):
            decided += 1
        if beats(a, b) and beats(b, c) and beats(c, a):
            cycles.append([a, b, c])
        elif beats(a, c) and beats(c, b) and beats(b, a):
            cycles.append([a, c, b])
    return cycles, decided


def analyse(entrants: list[Entrant], games: list[Game], games_per_pair: int, seed: int = 0) -> dict[str, Any]:
    """The population report written as ``population.json``."""
    names = [e.name for e in entrants]
    m = matrices(names, games)
    cycles, decided = three_cycles(names, m["score"])
    return {
        "entrants": [{"name": e.name, "kind": "builtin" if e.builtin else "adapter"} for e in entrants],
        "games_per_pair": games_per_pair, "games_played": len(games),
        **m,
        "ratings": ratings_with_intervals(names, games, seed=seed),
        "non_transitivity": {"three_cycles": cycles, "cyclic_triads": len(cycles), "decided_triads": decided},
    }
