"""Many episodes at once: bounded concurrency, per-episode timeouts, a run dir with transcripts.

Run dir layout::

    config.yaml         the resolved team and run options (enough to reproduce the run)
    transcripts.jsonl   one episode per line, appended as each finishes
    summary.json        statuses, rewards per role, validity, retries, throughput
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .engines.base import Engine
from .envs.base import Env
from .episode import run_episode
from .errors import RolecastError, WorkersLost
from .policies.base import Policy
from .policies.binding import Binding, load_callable
from .policies.engine import EnginePolicy
from .policies.openai import OpenAIPolicy
from .policies.python import PythonPolicy
from .policies.replay import ReplayPolicy
from .registry import Registry, default_registry
from .team import Team
from .files import append_line, write_atomic, write_yaml
from .training.plugin_faults import said_as
from .transcript import EpisodeRecord, error_text

log = structlog.get_logger()


@dataclass
class RunOptions:
    episodes: int
    seed: int
    out_dir: Path
    concurrency: int = 16
    episode_timeout_s: float = 900.0
    progress: bool = True
    # an open bar (a training run's) to count this run's episodes on a line beneath its own, removed
    # when the run ends; None: a bar of its own (rich draws one live display at a time on a console)
    bar: Progress | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in config.yaml (CLI choices)
    # episode index -> {role: adapter} for this episode only (e.g. a self-play opponent snapshot),
    # called as the episode starts: a choice that reads state moving meanwhile (a training run's
    # next step plays during this one's after_step) is made up front and passed as a list's __getitem__
    adapters_for: Callable[[int], dict[str, str]] | None = None
    # where episodes are played: None = here, with the given policies; else a coroutine function
    # that plays a record elsewhere and returns it played (a rollout worker: workers.py)
    play: Callable[[EpisodeRecord], Awaitable[EpisodeRecord]] | None = None
    # False: the result's episodes are read back from transcripts.jsonl when asked for, not held
    keep_episodes: bool = True


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    # in index order; without keep_episodes a view of transcripts.jsonl: each access reads a fresh
    # record from the file (edits to it are not kept), as long as the run dir stays where it is
    episodes: Sequence[EpisodeRecord]


def every_episode_failed(episodes: Sequence[EpisodeRecord]) -> EpisodeRecord | None:
    """The first episode when every one of ``episodes`` errored or timed out (their rewards are
    zeros that would read as a result), else None."""
    for episode in episodes:
        if not episode.failed:
            return None
    return episodes[0] if episodes else None


def build_policies(
    team: Team,
    overrides: Mapping[str, Binding],
    engine_factory: Callable[[], Engine],
    registry: Registry | None = None,
) -> dict[str, Policy]:
    """Bind every role: CLI overrides first, then the role's ``policy.bind``, else the model."""
    registry = registry or default_registry()
    unknown = sorted(set(overrides) - set(team.roles))
    if unknown:
        raise RolecastError(f"--policy names unknown role(s) {', '.join(unknown)} (team roles: {', '.join(team.roles)})")
    check_grammars(team, overrides)
    policies: dict[str, Policy] = {}
    replays: dict[str, ReplayPolicy] = {}
    engine_policy: EnginePolicy | None = None
    for name, spec in team.roles.items():
        binding = overrides.get(name) or spec.binding or Binding("model")
        if binding.kind == "model":
            engine_policy = engine_policy or EnginePolicy(engine_factory())
            policies[name] = engine_policy
        elif binding.kind == "replay":
            policies[name] = replays.setdefault(binding.target, ReplayPolicy(binding.target))
        elif binding.kind == "python":
            policies[name] = PythonPolicy(binding.fn or load_callable(binding.target))
        elif binding.kind == "openai":
            policies[name] = OpenAIPolicy(binding.target)
        else:
            with said_as(RolecastError, f"policy plugin {binding.target!r} for role {name!r}"):  # its own bug: one line
                policies[name] = registry.get("policies", binding.target)(spec)
    return policies


def check_grammars(team: Team, overrides: Mapping[str, Binding]) -> None:
    """Compile the grammar of every role the model plays, before any model loads: a schema xgrammar
    refuses is the role file's error (not checked at team load: xgrammar imports torch, seconds that
    runs with no model need not pay)."""
    for name, spec in team.roles.items():
        if (overrides.get(name) or spec.binding or Binding("model")).kind == "model":
            spec.check_grammar()


async def run_team(team: Team, policies: Mapping[str, Policy], options: RunOptions) -> RunResult:
    run_dir = options.out_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {"team": team.resolved(), "run": {"episodes": options.episodes, "seed": options.seed, **options.extra}}
    write_yaml(run_dir / "config.yaml", config)

    tally = Tally(team)
    kept: list[EpisodeRecord] | None = [] if options.keep_episodes else None
    # episode index -> its line's byte offset in transcripts.jsonl, a slot added as each index is
    # drawn: sized up front, --episodes 10**9 allocated 16 GB before the first episode
    offsets = array("q")
    started = time.perf_counter()
    path = (run_dir / "transcripts.jsonl").resolve()  # the result's episodes read it back, wherever the cwd is then
    transcripts = path.open("wb", buffering=0)  # each line written at once, whole or not at all (append_line)
    own = options.bar is None
    progress = progress_bar(options.progress) if own else options.bar
    # beneath a training run's bar, named by its folder: rollouts/step-000003 or evals/step-000002
    label = team.name if own else f"{run_dir.parent.name}/{run_dir.name}"
    bar = progress.add_task(f"{label} episodes", total=options.episodes)
    # concurrency lanes draw the next episode index as each finishes one: an episode's record
    # (and its task) exists only while it is in flight, whatever the number of episodes
    indices = iter(range(options.episodes))

    async def one(index: int) -> None:
        record = EpisodeRecord(
            id=f"{team.name}-{options.seed}-{index:05d}",
            index=index,
            team=team.name,
            task=team.tasks[index % len(team.tasks)],
            seed=options.seed,
            adapters=options.adapters_for(index) if options.adapters_for else {},
        )
        t0 = time.perf_counter()
        deadline = asyncio.timeout(options.episode_timeout_s)
        try:
            played = options.play(record) if options.play else run_episode(team, policies, record)
            async with deadline:
                record = await played
        except WorkersLost:
            raise
        except Exception as exc:  # a policy or environment fault ends this episode, not the run
            if deadline.expired():  # a TimeoutError of a policy's own (its API call's) is a fault like any other
                record.status, record.error = "timeout", f"episode exceeded {options.episode_timeout_s:g}s"
            else:
                record.status, record.error = "error", error_text(exc)
                log.warning("episode failed", episode=record.id, error=record.error)
        record.duration_s = time.perf_counter() - t0
        tally.add(record)
        if kept is not None:
            kept.append(record)
        offsets[index] = transcripts.tell()
        append_line(transcripts, (record.dumps() + "\n").encode("utf-8"))
        progress.advance(bar)

    async def lane() -> None:
        for index in indices:
            offsets.append(0)  # indices are drawn in order: this is offsets[index]
            await one(index)

    lanes = [asyncio.ensure_future(lane()) for _ in range(min(options.concurrency, options.episodes))]
    try:
        with progress if own else contextlib.nullcontext():
            await asyncio.gather(*lanes)
    finally:  # a run that stops (WorkersLost) stops its other episodes before the file closes under them
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        transcripts.close()
        if not own:
            progress.remove_task(bar)
    if kept is not None:
        kept.sort(key=lambda r: r.index)
    summary = tally.summary(time.perf_counter() - started)
    summary["run_dir"] = str(run_dir)
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    return RunResult(run_dir=run_dir, summary=summary, episodes=Transcripts(path, offsets) if kept is None else kept)


class Transcripts(Sequence[EpisodeRecord]):
    """A run's episode records in index order, each read back from its transcripts.jsonl when asked
    for: a run of millions of episodes need not hold them all."""

    def __init__(self, path: Path, offsets: array):
        self.path, self.offsets = path, offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        with self.path.open("rb") as fh:
            fh.seek(self.offsets[i])
            return EpisodeRecord.loads(fh.readline())

    def __iter__(self) -> Iterator[EpisodeRecord]:
        with self.path.open("rb") as fh:
            for offset in self.offsets:
                fh.seek(offset)
                yield EpisodeRecord.loads(fh.readline())


def progress_bar(enabled: bool) -> Progress:
    """A bar that counts its work (done of total), with the time it took and the time it has left."""
    return Progress(
        TextColumn("{task.description}", markup=False),  # a run's folder names it: exp[lr=1e-4] is no style
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=False,
        console=progress_console(),
    )


def progress_console() -> Console:
    """Where progress bars draw: stderr, as the logs do; stdout holds a command's result (the JSON
    line of run --json, train, compare), and a piped one printed the bar's last frame into it."""
    return Console(stderr=True)


def summarize(team: Team, records: Sequence[EpisodeRecord], wall_s: float) -> dict[str, Any]:
    tally = Tally(team)
    for record in records:
        tally.add(record)
    return tally.summary(wall_s)


class Tally:
    """summary.json's counts, added up one episode at a time as each finishes. Turn counts and
    rates describe the episodes that ran (a failed one is counted in ``status``, its turns cut
    short by the fault); throughput counts all the work done in ``wall_s``."""

    def __init__(self, team: Team):
        self.team = team
        self.status: Counter[str] = Counter()
        self.turns = self.valid_turns = self.first_tries = self.first_try_valid = self.retries = 0
        self.played = self.generated = 0  # every episode's turns and tokens, failed ones' too
        self.roles = {name: {"rewards": array("d"), "turns": 0, "invalid_turns": 0, "retries": 0} for name in team.roles}
        # only an env that measures outcomes keeps them (its outcome_metrics takes them all, so these
        # grow with the run), by index: summed in episode order, whatever order they finished in
        self.outcomes: list[tuple[int, dict[str, Any]]] | None = (
            [] if getattr(team.env_class.outcome_metrics, "__func__", None) is not Env.outcome_metrics.__func__ else None)

    def add(self, record: EpisodeRecord) -> None:
        self.status[record.status] += 1
        for t in record.turns:
            self.played += 1
            self.generated += sum(len(a.token_ids) if a.token_ids is not None else a.completion_tokens or 0
                                  for a in t.attempts)
        if record.failed:  # its rewards are placeholders, no result, and its turns were cut short
            return
        for t in record.turns:
            self.turns += 1
            self.valid_turns += t.valid
            self.retries += t.retries
            if t.attempts:
                self.first_tries += 1
                self.first_try_valid += t.attempts[0].valid
            if role := self.roles.get(t.role):
                role["turns"] += 1
                role["invalid_turns"] += not t.valid
                role["retries"] += t.retries
        for name, role in self.roles.items():
            if record.in_episode(name):
                role["rewards"].append(record.rewards.get(name, 0.0))
        if record.status == "ok" and self.outcomes is not None:
            self.outcomes.append((record.index, record.outcome))

    def summary(self, wall_s: float) -> dict[str, Any]:
        team = self.team
        per_role = {name: {"mean_reward": _mean(r["rewards"]), "reward_ci95": _ci95(r["rewards"]),
                           "turns": r["turns"], "invalid_turns": r["invalid_turns"], "retries": r["retries"]}
                    for name, r in self.roles.items()}
        try:
            outcomes = [outcome for _, outcome in sorted(self.outcomes, key=lambda o: o[0])] if self.outcomes else []
            env_metrics = team.env_class.outcome_metrics(team.env_config, outcomes) if outcomes else {}
            env_metrics = {k: round(float(v), 4) for k, v in env_metrics.items()}
        except Exception as exc:  # an env plugin's fault, found after every episode: it costs its measures, not the summary
            log.warning("outcome_metrics failed", env=team.env_class.__name__, error=f"{type(exc).__name__}: {exc}")
            env_metrics = {}
        return {
            "team": team.name,
            "episodes": sum(self.status.values()),
            "status": dict(self.status),
            "turns": self.turns,
            "valid_turn_rate": round(self.valid_turns / self.turns, 4) if self.turns else None,
            "first_try_valid_rate": round(self.first_try_valid / self.first_tries, 4) if self.first_tries else None,
            "retries": self.retries,
            "roles": per_role,
            "env": env_metrics,
            "generated_tokens": self.generated,
            "wall_s": round(wall_s, 3),
            "generated_tok_s": round(self.generated / wall_s, 2) if wall_s > 0 else None,
            "messages_per_s": round(self.played / wall_s, 2) if wall_s > 0 else None,
        }


def _mean(values: Sequence[float]) -> float | None:
    return round(math.fsum(values) / len(values), 4) if values else None  # fsum: exact, whatever order episodes finished in


# Student's t 97.5% quantiles for 1..30 degrees of freedom
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.306, 2.2622, 2.2281, 2.201, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.093, 2.086, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423)


def _ci95(values: Sequence[float]) -> float | None:
    """Half-width of a Student's t 95% interval of the mean: 1.96 (the normal quantile) covered
    70% of means at 2 episodes, 91% at 8."""
    if len(values) < 2:
        return None
    n, m = len(values), math.fsum(values) / len(values)
    var = math.fsum((v - m) ** 2 for v in values) / (n - 1)
    z = 1.959964  # past 30 degrees of freedom, the quantile's expansion in 1/df (Cornish-Fisher), within 1e-4
    t = _T975[n - 2] if n <= 31 else z + (z**3 + z) / (4 * (n - 1)) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * (n - 1) ** 2)
    return round(t * math.sqrt(var / n), 4)
