"""Many episodes at once: bounded concurrency, per-episode timeouts, a run dir with transcripts.

Run dir layout::

    config.yaml         the resolved team and run options (enough to reproduce the run)
    transcripts.jsonl   one episode per line, appended as each finishes
    summary.json        statuses, rewards per role, validity, retries, throughput
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .engines.base import Engine
from .episode import run_episode
from .errors import RolecastError
from .policies.base import Policy
from .policies.binding import Binding, load_callable
from .policies.engine import EnginePolicy
from .policies.openai import OpenAIPolicy
from .policies.python import PythonPolicy
from .policies.replay import ReplayPolicy
from .registry import Registry, default_registry
from .team import Team
from .training.metrics import write_atomic
from .transcript import EpisodeRecord

log = structlog.get_logger()


@dataclass
class RunOptions:
    episodes: int
    seed: int
    out_dir: Path
    concurrency: int = 16
    episode_timeout_s: float = 900.0
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in config.yaml (CLI choices)
    # episode index -> {role: adapter} for this episode only (e.g. a self-play opponent snapshot)
    adapters_for: Callable[[int], dict[str, str]] | None = None
    # where episodes are played: None = here, with the given policies; else a coroutine function
    # that plays a record elsewhere and returns it played (a rollout worker: workers.py)
    play: Callable[[EpisodeRecord], Awaitable[EpisodeRecord]] | None = None


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    episodes: list[EpisodeRecord]


def every_episode_failed(episodes: list[EpisodeRecord]) -> EpisodeRecord | None:
    """The first episode when every one of ``episodes`` errored or timed out (their rewards are
    zeros that would read as a result), else None."""
    failed = [e for e in episodes if e.failed]
    return failed[0] if failed and len(failed) == len(episodes) else None


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
            policies[name] = registry.get("policies", binding.target)(spec)
    return policies


async def run_team(team: Team, policies: Mapping[str, Policy], options: RunOptions) -> RunResult:
    run_dir = options.out_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {"team": team.resolved(), "run": {"episodes": options.episodes, "seed": options.seed, **options.extra}}
    write_atomic(run_dir / "config.yaml", yaml.safe_dump(config, sort_keys=False, allow_unicode=True))

    semaphore = asyncio.Semaphore(options.concurrency)
    records: list[EpisodeRecord] = []
    started = time.perf_counter()
    transcripts = (run_dir / "transcripts.jsonl").open("w", encoding="utf-8")
    progress = _progress(options.progress)
    bar = progress.add_task(f"{team.name} episodes", total=options.episodes)

    async def one(index: int) -> None:
        record = EpisodeRecord(
            id=f"{team.name}-{options.seed}-{index:05d}",
            index=index,
            team=team.name,
            task=team.tasks[index % len(team.tasks)],
            seed=options.seed,
            adapters=options.adapters_for(index) if options.adapters_for else {},
        )
        async with semaphore:
            t0 = time.perf_counter()
            deadline = asyncio.timeout(options.episode_timeout_s)
            try:
                played = options.play(record) if options.play else run_episode(team, policies, record)
                async with deadline:
                    record = await played
            except Exception as exc:  # a policy or environment fault ends this episode, not the run
                if deadline.expired():  # a TimeoutError of a policy's own (its API call's) is a fault like any other
                    record.status, record.error = "timeout", f"episode exceeded {options.episode_timeout_s:g}s"
                else:
                    record.status, record.error = "error", f"{type(exc).__name__}: {exc}"
                    log.warning("episode failed", episode=record.id, error=record.error)
            record.duration_s = time.perf_counter() - t0
        records.append(record)
        transcripts.write(record.dumps() + "\n")
        transcripts.flush()
        progress.advance(bar)

    try:
        with progress:
            await asyncio.gather(*(one(i) for i in range(options.episodes)))
    finally:
        transcripts.close()
    records.sort(key=lambda r: r.index)
    summary = summarize(team, records, time.perf_counter() - started)
    summary["run_dir"] = str(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return RunResult(run_dir=run_dir, summary=summary, episodes=records)


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
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


def summarize(team: Team, records: list[EpisodeRecord], wall_s: float) -> dict[str, Any]:
    """Turn counts and rates describe the episodes that ran (a failed one is counted in ``status``,
    its turns cut short by the fault); throughput counts all the work done in ``wall_s``."""
    played = [t for r in records for t in r.turns]
    results = [r for r in records if not r.failed]  # a failed episode's rewards are placeholders, no result
    turns = [t for r in results for t in r.turns]
    per_role: dict[str, dict[str, Any]] = {}
    for name in team.roles:
        mine = [t for t in turns if t.role == name]
        values = [r.rewards.get(name, 0.0) for r in results]
        per_role[name] = {
            "mean_reward": _mean(values),
            "reward_ci95": _ci95(values),
            "turns": len(mine),
            "invalid_turns": sum(not t.valid for t in mine),
            "retries": sum(t.retries for t in mine),
        }
    generated = sum(len(a.token_ids) if a.token_ids is not None else a.completion_tokens or 0
                    for t in played for a in t.attempts)
    finished = [r.outcome for r in records if r.status == "ok"]
    try:
        env_metrics = team.env_class.outcome_metrics(team.env_config, finished) if finished else {}
        env_metrics = {k: round(float(v), 4) for k, v in env_metrics.items()}
    except Exception as exc:  # an env plugin's fault, found after every episode: it costs its measures, not the summary
        log.warning("outcome_metrics failed", env=team.env_class.__name__, error=f"{type(exc).__name__}: {exc}")
        env_metrics = {}
    return {
        "team": team.name,
        "episodes": len(records),
        "status": dict(Counter(r.status for r in records)),
        "turns": len(turns),
        "valid_turn_rate": _mean([float(t.valid) for t in turns]),
        "first_try_valid_rate": _mean([float(t.attempts[0].valid) for t in turns if t.attempts]),
        "retries": sum(t.retries for t in turns),
        "roles": per_role,
        "env": env_metrics,
        "generated_tokens": generated,
        "wall_s": round(wall_s, 3),
        "generated_tok_s": round(generated / wall_s, 2) if wall_s > 0 else None,
        "messages_per_s": round(len(played) / wall_s, 2) if wall_s > 0 else None,
    }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


# Student's t 97.5% quantiles for 1..30 degrees of freedom
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.306, 2.2622, 2.2281, 2.201, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.093, 2.086, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423)


def _ci95(values: list[float]) -> float | None:
    """Half-width of a Student's t 95% interval of the mean: 1.96 (the normal quantile) covered
    70% of means at 2 episodes, 91% at 8."""
    if len(values) < 2:
        return None
    n, m = len(values), sum(values) / len(values)
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    z = 1.959964  # past 30 degrees of freedom, the quantile's expansion in 1/df (Cornish-Fisher), within 1e-4
    t = _T975[n - 2] if n <= 31 else z + (z**3 + z) / (4 * (n - 1)) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * (n - 1) ** 2)
    return round(t * math.sqrt(var / n), 4)
