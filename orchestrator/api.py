"""rolecast's Python API: ``run``, ``evaluate`` and ``train`` do what the commands of those names
do (the commands parse their flags into these calls), for scripts and notebooks::

    import rolecast

    result = rolecast.run("recipes/debate.yaml", episodes=8)
    result.summary["roles"]["pro"]["mean_reward"]
    trained = rolecast.train("recipes/guess_number.yaml", steps=2, sets={"group_size": 4})
    trained.final["eval_reward/guesser"], trained.run_dir

A team argument is a loaded ``Team``, the path of its file, or the mapping the file would hold. A mistake a user can fix raises
``RolecastError`` with the one line the command prints. Each call runs its episodes on an event
loop of its own; inside a running loop (a Jupyter cell) that loop lives in a helper thread and
the call returns when the work is done. From async code, call them through ``asyncio.to_thread``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from .config import SEED_MAX
from .errors import RolecastError
from .launch import (Compute, adapter_dirs, bindings, claimed, closed_on_error, play, policies_and_workers,
                     recorded_run, run_dir)
from .rollout import RunOptions, RunResult
from .team import PLUGIN_OPTIONS, Team, with_training_options
from .team import load_team as _load_team
from .files import write_atomic
from .yamlfile import format_loc, plain_copy

T = TypeVar("T")
TeamLike = Team | str | Path | Mapping[str, Any]
Policies = Mapping[str, "str | Callable[..., Any]"]


def load_team(source: TeamLike, sets: Mapping[str, Any] | None = None) -> Team:
    """The team or recipe file at ``source``, or the mapping such a file would hold (a team
    written in code: its paths relative to the current folder), checked, or a loaded ``Team``;
    ``sets`` changes training options as ``--set`` does (``{"group_size": 4,
    "adam.learning_rate": 1e-4}``), checked as the file's own are."""
    _check_arguments(source=source, sets=sets)
    return with_training_options(_team(source), sets or {})


def register_plugin(plugin: Any, name: str | None = None) -> None:
    """Register a plugin defined in this process (a module, or any object or class whose functions
    carry ``@hookimpl``: ``register_envs``, ``register_rewards`` ...) as an installed one is
    through its entry point, for teams loaded after it, under ``name`` (default: the module's or
    class's own). The same plugin name may register again
    (a notebook cell run twice): its names then hold the new objects. A plugin that breaks the
    contract raises RolecastError and changes nothing. Ray rollout workers are other processes:
    there, only installed plugins' builtin policies are known (environments travel with the team)."""
    from .registry import default_registry

    if name is not None and not (isinstance(name, str) and name):  # "" fell back to the plugin's own name, unsaid
        raise RolecastError(f"plugin name={name!r}: must be a non-empty string")
    registry = default_registry()
    name = name or getattr(plugin, "__name__", type(plugin).__name__)
    if any(p == name and not source.startswith("in-process") for p, source in registry.plugins):
        raise RolecastError(f"plugin {name}: the name of an installed plugin; register under another name")
    if not any(hasattr(getattr(plugin, attr, None), "rolecast_impl") for attr in dir(plugin)):
        raise RolecastError(f"plugin {name}: {plugin!r} has no hook (a module or object whose functions carry "
                            "@rolecast.hookimpl: register_envs, register_rewards ...)")
    failures = len(registry.failures)
    registry.add_module(plugin, name, f"in-process ({getattr(plugin, '__module__', None) or name})")
    if len(registry.failures) > failures:
        problem = registry.failures[failures].error
        del registry.failures[failures:]
        raise RolecastError(f"plugin {name}: {problem}")


def run(team: TeamLike, *, episodes: int | None = None, tasks: Sequence[str | Mapping[str, Any]] | None = None,
        out: str | Path | None = None, seed: int | None = None, concurrency: int | None = None,
        timeout: float | None = None, policies: Policies | None = None, adapters: Mapping[str, str | Path] | None = None,
        progress: bool = True, model: str | None = None, dtype: str = "auto", engine: str = "hf",
        device: str = "auto", ray: str | None = None, rollout_workers: int | None = None) -> RunResult:
    """Play ``episodes`` episodes of ``team`` (default: the team's ``episodes``) into the run dir
    ``out`` (default ``runs/<team>-<time>``, which must not hold a run yet); as ``rolecast run``.

    ``tasks`` replace the team's (each as ``--task`` reads it, or a task mapping); ``policies``
    bind roles (role -> ``replay:FILE``, ``builtin:NAME``, ``openai:MODEL@URL`` ... or a callable
    ``fn(request) -> str``); ``adapters`` load PEFT adapter dirs under the names the roles play.
    The result holds the run dir, the summary (summary.json) and every episode's record (read back from
    transcripts.jsonl as each is asked for: a run of millions of episodes need not fit in memory)."""
    _check_arguments(team=team, episodes=episodes, concurrency=concurrency, timeout=timeout, seed=seed, tasks=tasks,
                     policies=policies, adapters=adapters, out=out, progress=progress)
    team = _team(team)
    if tasks is not None:
        team = dataclasses.replace(team, tasks=[_task(team, t) for t in tasks])
    compute = Compute(model, dtype, engine, device, ray, rollout_workers)
    overrides, loaded = bindings(policies), adapter_dirs(adapters)
    cfg = team.config
    model = compute.model or cfg.model
    seed = cfg.seed if seed is None else seed
    out_dir = run_dir(out, team.name, fresh=True)
    with claimed(out_dir):
        policies_, workers = policies_and_workers(compute, team, overrides, model, seed, loaded)
        with closed_on_error(workers):
            options = RunOptions(
                episodes=episodes or cfg.episodes, seed=seed, out_dir=out_dir, concurrency=concurrency or cfg.concurrency,
                episode_timeout_s=timeout or cfg.episode_timeout_s, progress=progress, keep_episodes=False,
                extra={**_record(compute, model, overrides, loaded), "rollout_workers": workers.workers if workers else None})
            return _sync(lambda: play(team, policies_, options, workers, overrides))


@dataclass
class Evaluation:
    report: dict[str, Any]  # eval.json: per role W-D-L, win rate with its 95% interval, mean reward
    run: RunResult


def evaluate(team: TeamLike, *, episodes: int | None = None, held_out: bool = False, opponent: str | None = None,
             out: str | Path | None = None, seed: int | None = None, concurrency: int | None = None,
             timeout: float | None = None, policies: Policies | None = None,
             adapters: Mapping[str, str | Path] | None = None, progress: bool = True,
             model: str | None = None, dtype: str = "auto", engine: str = "hf", device: str = "auto",
             ray: str | None = None, rollout_workers: int | None = None) -> Evaluation:
    """Play ``episodes`` episodes of ``team`` (default 100) and report per role win/draw/loss rates
    with 95% intervals, into ``out`` (default ``runs/eval-<team>-<time>``) with its eval.json; as
    ``rolecast eval``. ``held_out`` plays the recipe's ``training.eval_tasks``; ``opponent``
    rebinds its opponent role (``random``, ``minimax``, any builtin, ``base`` or
    ``checkpoint:PATH``); ``timeout``, ``policies`` and ``adapters`` as for ``run``."""
    import structlog

    from .evaluation import CHECKPOINT_ADAPTER, bind_opponent, blind_random_roles, evaluate as rates

    _check_arguments(team=team, episodes=episodes, concurrency=concurrency, timeout=timeout, seed=seed, policies=policies,
                     adapters=adapters, out=out, opponent=opponent, held_out=held_out, progress=progress)
    team = _team(team)
    if held_out:
        if team.eval_tasks is None:
            raise RolecastError(f"--held-out: {team.path} has no training.eval_tasks")
        team = dataclasses.replace(team, tasks=team.eval_tasks)
    compute = Compute(model, dtype, engine, device, ray, rollout_workers)
    overrides, loaded = bindings(policies), adapter_dirs(adapters)
    opponent_role, checkpoint = None, None
    if opponent is not None:  # "" too (an unset variable): else played as the recipe binds it, said nowhere
        team, opponent_role, checkpoint = bind_opponent(team, opponent, overrides)
    if checkpoint and CHECKPOINT_ADAPTER in loaded:  # else the checkpoint loaded over it, and config.yaml named it
        raise RolecastError(f"--adapter {CHECKPOINT_ADAPTER}: --opponent {opponent} loads the opponent under that name; "
                            f"drop one")
    cfg = team.config
    model = compute.model or cfg.model
    seed = cfg.seed if seed is None else seed
    shown = {name: str(overrides.get(name) or spec.binding or f"model ({spec.config.policy.adapter or 'base'})")
             for name, spec in team.roles.items()}
    if blind := blind_random_roles(team, shown):
        structlog.get_logger().warning("builtin:random is no baseline here: the game lists no legal moves, so it sends "
                                       "random words and loses", team=team.name, roles=blind)
    out_dir = run_dir(out, f"eval-{team.name}", fresh=True)
    with claimed(out_dir):
        policies_, workers = policies_and_workers(compute, team, overrides, model, seed, loaded,
                                                  {CHECKPOINT_ADAPTER: checkpoint} if checkpoint else None)
        with closed_on_error(workers):
            options = RunOptions(episodes=episodes or 100, seed=seed, out_dir=out_dir,
                                 concurrency=concurrency or cfg.concurrency, episode_timeout_s=timeout or cfg.episode_timeout_s,
                                 progress=progress, keep_episodes=False,
                                 extra={"eval": True, "opponent": opponent, **_record(compute, model, overrides, loaded)})
            result = _sync(lambda: play(team, policies_, options, workers, overrides))
        report = {"team": team.name, "episodes": len(result.episodes), "status": result.summary["status"],
                  "opponent": {"role": opponent_role, "policy": opponent} if opponent_role else None,
                  "bindings": shown, "roles": rates(team, result.episodes, result.summary),
                  "env": result.summary["env"], "illegal_baseline": blind, "run_dir": str(result.run_dir)}
        write_atomic(result.run_dir / "eval.json", json.dumps(report, indent=2))
    return Evaluation(report=report, run=result)


@dataclass
class TrainResult:
    run_dir: Path  # adapters, checkpoints, metrics.jsonl, evaluations: docs/training.md
    final: dict[str, Any]  # the final evaluation's row of metrics.jsonl


def train(recipe: TeamLike, *, steps: int | None = None, out: str | Path | None = None, resume: bool = False,
          seed: int | None = None, sets: Mapping[str, Any] | None = None, progress: bool = True,
          model: str | None = None, dtype: str = "auto", engine: str = "hf", device: str = "auto",
          ray: str | None = None, rollout_workers: int | None = None) -> TrainResult:
    """Train the recipe's trainable roles, each its own LoRA adapter, for ``steps`` steps (default:
    the recipe's) into the run dir ``out`` (default ``runs/train-<recipe>-<time>``); as ``rolecast
    train``. ``sets`` changes training options (``{"group_size": 4}``); ``resume`` continues the
    run in ``out`` from its last checkpoint, with the model, seed and steps it was started with
    unless given."""
    _check_arguments(recipe=recipe, steps=steps, seed=seed, sets=sets, out=out, resume=resume, progress=progress)
    team = with_training_options(_team(recipe), sets or {})
    steps = steps_given(team, sets or {}, steps)
    if resume and out is None:
        raise RolecastError("--resume needs --out RUN_DIR (the run to continue)")
    where = run_dir(out, f"train-{team.name}")
    compute = Compute(model, dtype, engine, device, ray, rollout_workers)
    if resume:
        compute, seed, steps = as_started(team, where, compute, seed, steps)
    return train_into(team, where, compute, seed=seed, steps=steps, resume=resume, progress=progress)


def steps_given(team: Team, sets: Mapping[str, Any], steps: int | None) -> int | None:
    """``--steps``, else ``--set steps=N``, the same thing: a resumed run's steps default to what
    its config.yaml recorded, which would pass over the set ones. Both, and different: one line (the
    --steps had won, while config.yaml recorded the set ones as the recipe's)."""
    if "steps" not in sets:
        return steps
    if steps is not None and steps != team.config.training.steps:
        raise RolecastError(f"--steps {steps} and --set steps={team.config.training.steps} disagree: give one")
    return team.config.training.steps


def as_started(team: Team, out: Path, compute: Compute, seed: int | None,
               steps: int | None) -> tuple[Compute, int | None, int | None]:
    """A resumed run continues the run it checkpointed: model, dtype, seed and steps default to what its
    config.yaml recorded, and a recipe, model, seed or training option that differs from it stops
    here with one line (its adapters' shapes, its schedule and its RNG belong to those)."""
    recorded = recorded_run(out)
    if recorded is None:  # said before the model loads, and before anything makes the folder
        raise RolecastError(f"--resume: {out} holds no training run (no config.yaml)")
    if "recipe" not in recorded:  # `rolecast run` and `eval` record a "team": no training to go on with, a config to keep
        raise RolecastError(f"--resume: {out} holds no training run (its config.yaml is a played run's): give another --out")
    recipe, then_run = recorded.get("recipe") or {}, recorded.get("run") or {}
    if recipe.get("name", team.name) != team.name:
        raise RolecastError(f"--resume: {out} is a run of recipe {recipe['name']!r}, not {team.name!r}")
    for flag, given in (("model", compute.model), ("seed", seed)):
        if flag in then_run and given is not None and given != then_run[flag]:
            raise RolecastError(f"--resume: {out} was started with --{flag} {then_run[flag]}; this command gives {given}")
    then, now = _learnt_from(recipe, team), _learnt_from(team.resolved(), team)
    if (loc := _first_change(then, now)) is not None:
        was, has = then, now
        for part in loc:
            was, has = [v.get(part, _UNSET) if isinstance(v, dict) else v[part] for v in (was, has)]
        shown = [text if len(text := repr(v)) < 60 else text[:57] + "..." for v in (was, has)]
        raise RolecastError(f"--resume: {out} was started with {format_loc(loc)} = {shown[0]}, this command has "
                            f"{shown[1]}: resume with the recipe and --set flags it was started with")
    from .training.loop import last_checkpoint

    # said before the model loads (under compare, before the strategies named ahead of it train)
    if steps and (done := last_checkpoint(out, "--resume")) and done[1]["step"] > steps:
        raise RolecastError(f"--resume: {out} is at step {done[1]['step']}, past --steps {steps}")
    # --dtype's default, auto, is bf16 where the CPU has it: a float32 run would go on in bf16
    dtype = then_run.get("dtype", compute.dtype) if compute.dtype == "auto" else compute.dtype
    return (dataclasses.replace(compute, model=compute.model or then_run.get("model"), dtype=dtype),
            then_run.get("seed") if seed is None else seed, steps or then_run.get("steps"))


class _Unset:
    def __repr__(self) -> str:
        return "(not set)"


_UNSET = _Unset()
# training options the recipe writes out key by key, no defaults filled in
_WRITTEN = tuple(("training", k) for k in (*PLUGIN_OPTIONS, "role_loss_config", "repetition_penalty"))


def _learnt_from(recipe: Mapping[str, Any], team: Team) -> dict[str, Any]:
    """What a resumed run must share with the run it continues: the protocol (its defaults filled in:
    a key deleted since falls back to one), roles, tasks and training options, less the steps
    (which may extend it) and the roles' template paths (a moved checkout)."""
    out = {k: recipe[k] for k in ("protocol", "roles", "tasks", "max_turns", "training") if k in recipe}
    protocol = out.get("protocol")
    if isinstance(protocol, dict) and protocol.get("type") == team.config.protocol.type:
        try:
            options = team.env_class.Config.model_validate({k: v for k, v in protocol.items() if k != "type"})
            out["protocol"] = {"type": protocol["type"], **options.model_dump(mode="json", by_alias=True)}
        except ValidationError:  # options this code refuses (the run's own, from an older rolecast): as written
            pass
    if isinstance(out.get("roles"), list):
        out["roles"] = [{k: v for k, v in r.items() if k not in ("prompt", "followup")} if isinstance(r, dict) else r
                        for r in out["roles"]]
    if isinstance(out.get("training"), dict):
        out["training"] = {k: v for k, v in out["training"].items() if k != "steps"}
        then = out["training"].get("eval_tasks")  # a file's path, as an older rolecast recorded it: its tasks unknown
        if isinstance(then, str) and then == team.config.training.eval_tasks:
            out["training"]["eval_tasks"] = team.eval_tasks
    return out


def _first_change(then: Any, now: Any, loc: tuple = ()) -> tuple | None:
    """Where recorded ``then`` and ``now`` first differ. In the protocol, the tasks, a role's params
    and the training options written key by key (``_WRITTEN``: a ``--set`` left off) a key one side
    lacks is an edit; elsewhere (options the code fills in) it is an option newer than the run, or
    gone since, with nothing to compare it with."""
    if isinstance(then, dict) and isinstance(now, dict):
        if (loc[:1] in (("protocol",), ("tasks",)) or loc[:2] in _WRITTEN or "params" in loc) \
                and (odd := sorted(set(then) ^ set(now), key=str)):
            return loc + (odd[0],)
        return next((c for k in then if k in now and (c := _first_change(then[k], now[k], loc + (k,)))), None)
    if isinstance(then, list) and isinstance(now, list) and len(then) == len(now):
        return next((c for i, pair in enumerate(zip(then, now)) if (c := _first_change(*pair, loc + (i,)))), None)
    return None if then == now else loc


def train_into(team: Team, out: Path, compute: Compute, *, seed: int | None = None, steps: int | None = None,
               resume: bool = False, progress: bool = True, extra: dict[str, Any] | None = None) -> TrainResult:
    """Train ``team`` into ``out`` on a fresh engine and training service; ``extra`` is recorded in
    its config.yaml beside the run options."""
    from .engines.load import adapter_rank, device_for, load_engine
    from .training.client import ServiceClient
    from .training.loop import TrainingRun, TrainOptions, check_start

    check_start(team, out, resume)
    model = compute.model or team.config.model
    seed = team.config.seed if seed is None else seed
    # vLLM sizes its adapter slots by the largest rank it will hold: the learners', an eval opponent's
    opponent = team.config.training.eval_opponent or ""
    rank = max(team.config.training.lora.rank,
               adapter_rank(Path(opponent.partition(":")[2])) if opponent.startswith("checkpoint:") else 0)
    with claimed(out):  # TrainingRun checks the start again, under it
        workers = compute.workers(model, seed, rank)  # first: a missing Ray fails before the model loads
        with closed_on_error(workers):  # the workers outlive nothing that fails here
            engine = load_engine(model, compute.dtype, seed, compute.engine, device=compute.device, lora_rank=rank)
            service = ServiceClient.for_engine(engine, model, seed=seed, device=device_for(compute.device))
            service.attach_engine(engine)
            where = {"rollout_workers": workers.workers, "ray": compute.ray} if workers else {}
            options = TrainOptions(out_dir=out, model=model, dtype=compute.dtype, seed=seed, steps=steps, resume=resume,
                                   progress=progress, extra={"device": str(service.device), **where, **(extra or {})})

            async def go() -> TrainResult:
                try:
                    return TrainResult(out, await TrainingRun(team, options, engine, service, rollouts=workers).run())
                finally:
                    await engine.aclose()
                    service.close()
                    if workers:
                        workers.close()

            return _sync(go)


def _team(team: TeamLike) -> Team:
    return team if isinstance(team, Team) else _load_team(team)


def _task(team: Team, value: str | Mapping[str, Any]) -> dict[str, Any]:
    """A task as ``--task`` reads it (text the protocol parses) or as a team file holds it (a
    mapping of plain data, copied), checked as a team file's tasks are."""
    try:
        task = dict(value) if isinstance(value, Mapping) else team.env_class.task_from_cli(value)
    except ValueError as exc:
        raise RolecastError(f"--task {value}: {exc}") from None
    if problem := team.env_class.task_problem(team.env_config, task):  # with its key: "required key is missing"
        from .envs.base import Env

        # a plugin's env that reads other keys but keeps the default reading of --task
        plain = not isinstance(value, Mapping) and team.env_class.task_from_cli.__func__ is Env.task_from_cli.__func__
        why = (f' (this protocol reads --task VALUE as {{"text": VALUE}}: give whole tasks in a team file, or '
               f'override {team.env_class.__name__}.task_from_cli)') if plain else ""
        raise RolecastError(f"--task {value}: {format_loc(problem[0]) + ': ' if problem[0] else ''}{problem[1]}{why}")
    try:  # config.yaml and each transcript line hold it: a Path or a set there was a traceback after the model loaded
        return plain_copy(task)
    except ValueError as exc:
        raise RolecastError(f"--task {value}: {exc}") from None


def _check_arguments(**given: Any) -> None:
    """The keywords' kinds, each None (the team's default) or what it must be, said in one line
    before anything starts; the CLI's argparse types check the same, so this speaks to API callers."""
    def number(value: Any, kind: type | tuple[type, ...]) -> bool:
        return isinstance(value, kind) and not isinstance(value, bool)

    for name, value in given.items():
        if value is None:
            continue
        if name in ("episodes", "concurrency", "steps"):
            ok, want = number(value, int) and value > 0, "a whole number above 0"
        elif name == "timeout":
            ok, want = number(value, (int, float)) and value > 0, "a number of seconds above 0"
        elif name == "seed":
            ok, want = number(value, int) and 0 <= value <= SEED_MAX, "a whole number from 0 to 2**63 - 1"
        elif name == "tasks":
            # each checked too: a protocol's --task reader takes text (int(None) was a TypeError, int(3.5) a 3)
            ok, want = isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0 \
                and all(isinstance(t, (str, Mapping)) for t in value), \
                "a list of one or more tasks (text as --task reads it, or mappings)"
        elif name in ("team", "recipe", "source"):
            ok, want = isinstance(value, (str, os.PathLike, Mapping, Team)), "a team file's path, a mapping, or a Team"
        elif name == "out":  # "" is no folder: Path("") would be the current one
            ok, want = isinstance(value, (str, os.PathLike)) and value != "", "a folder's path"
        elif name in ("held_out", "resume", "progress"):  # "no" is truthy: it would resume, or play the eval tasks
            ok, want = isinstance(value, bool), "True or False"
        elif name == "opponent":
            ok, want = isinstance(value, str), "text, as --opponent reads it"
        elif name == "policies":
            ok, want = isinstance(value, Mapping) and all(isinstance(k, str) for k in value), \
                "a mapping of role names to bindings"
        elif name == "adapters":
            ok, want = isinstance(value, Mapping) and all(
                isinstance(k, str) and isinstance(v, (str, os.PathLike)) for k, v in value.items()), \
                "a mapping of names to adapter dirs"
        else:  # sets
            ok, want = isinstance(value, Mapping), "a mapping"
        if not ok:
            raise RolecastError(f"{name}={value!r}: must be {want}")


def _record(compute: Compute, model: str, overrides: Mapping[str, Any], adapters: Mapping[str, Path]) -> dict[str, Any]:
    """What a run's config.yaml records of how it was played."""
    return {"model": model, "dtype": compute.dtype, "engine": compute.engine, "device": compute.device,
            "policy": [f"{role}={b}" for role, b in overrides.items()],
            "adapter": [f"{name}={path}" for name, path in adapters.items()], "ray": compute.ray}


def _sync(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``work()`` makes to the end, on a loop of its own: here, or in a helper
    thread where this thread already runs a loop (asyncio.run refuses to nest). An interrupt while
    it waits there (a notebook's stop button) cancels the work, as Ctrl-C does a command's."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        kept: list[T] = []

        async def keep() -> None:
            kept.append(await work())

        # the main task ends with no result: asyncio.run's SIGINT restore reprs that task (signal's
        # enum lookup of the handler), and its result in full: every episode's record, seconds a big run
        asyncio.run(keep())
        return kept[0]
    started: concurrent.futures.Future = concurrent.futures.Future()

    async def main() -> T:
        started.set_result((asyncio.get_running_loop(), asyncio.current_task()))
        return await work()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rolecast") as pool:
        done = pool.submit(asyncio.run, main())
        try:
            return done.result()
        except KeyboardInterrupt:
            loop, task = started.result()
            loop.call_soon_threadsafe(task.cancel)
            concurrent.futures.wait([done])
            raise
