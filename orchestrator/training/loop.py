"""``rolecast train``: rollout, rewards, advantages, forward_backward over every trained
adapter's datums, an optim_step per adapter, refresh the sampler; evaluate and checkpoint every
K steps.

Run dir::

    config.yaml                   the resolved recipe and run options
    metrics.jsonl                 one line per step (and per evaluation)
    tb/                           TensorBoard events of the same metrics (an evaluation's episodes and
                                  engine/ counts as eval_episodes, eval_engine/...)
    rollouts/step-000001/         that step's transcripts.jsonl, summary.json and credit.jsonl (each
                                  role's reward and advantage per episode, and whether it trained)
    checkpoints/step-000005/      every adapter's weights, optimizer, RNG; trainer state
    checkpoints/latest            the name of the last complete checkpoint (replaced atomically)

A checkpoint is written to a temp dir and renamed into place before ``latest`` names it, so a
kill -9 at any moment leaves the last good one; ``--resume`` continues at the step after the
newest whole checkpoint (one damaged since, say a folder deleted by hand, is passed over).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable

import structlog

from ..config import RECIPE_LOSS_DEFAULTS, TrainingConfig
from ..engines.base import Engine
from ..engines.load import load_adapter
from ..episode import derive_seed
from ..errors import RolecastError, RunFailed
from ..evaluation import CHECKPOINT_ADAPTER, bind_opponent
from ..evaluation import evaluate as evaluate_results
from ..launch import recorded_run
from ..registry import Registry, config_model, default_registry
from ..rollout import RunOptions, build_policies, check_grammars, every_episode_failed, progress_bar, run_team
from ..team import Team, trainable_roles
from ..transcript import EpisodeRecord
from .datums import DatumBuildOptions, role_datums
from ..files import fsync_dir, read_saved, write_atomic, write_yaml
from .metrics import MetricsWriter, read_metrics
from .plugin_faults import blamed, checked, learning, measured, said_as, seated
from .repetition import penalise_repetition
from .rng import read_rng, save_rng, seed_rng, set_rng
from .trainer import build_trainer
from .turn_credit import TurnAdvantages, combined, history_advantages, turn_advantages
from .types import MEAN_NAMED, AdamParams, Datum, LoraConfig

log = structlog.get_logger()


@dataclass
class TrainOptions:
    out_dir: Path
    model: str
    dtype: str = "auto"
    seed: int = 0
    steps: int | None = None  # default: the recipe's training.steps
    resume: bool = False
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def check_start(team: Team, run_dir: Path, resume: bool) -> None:
    """What refuses a training run before any model loads: a recipe with no training block, and a
    fresh run into a dir that holds one (a training run's rows would mix with ours; a played run's
    config be lost)."""
    if team.config.training is None:
        raise RolecastError(f"{team.path}: the recipe has no `training:` block")
    check_grammars(team, {})
    if not resume:
        if (run_dir / "metrics.jsonl").exists():
            raise RolecastError(f"{run_dir} already holds a training run: add --resume to continue it, "
                                "or give another --out")
        if (run_dir / "config.yaml").exists():
            try:  # a training run killed before its first row: --resume starts it again from step 0
                stopped = "recipe" in (recorded_run(run_dir) or {})
            except RolecastError:
                stopped = False
            raise RolecastError(f"{run_dir} already holds a run (its config.yaml): give another --out" +
                                (", or add --resume: it stopped before its first step" if stopped else ""))


class TrainingRun:
    def __init__(self, team: Team, options: TrainOptions, engine: Engine, service: Any, registry: Registry | None = None,
                 rollouts: Any = None):
        check_start(team, options.out_dir, options.resume)
        self.team = team
        self.cfg: TrainingConfig = team.config.training
        self.options = options
        self.registry = registry or default_registry()
        self.engine = engine
        self.service = service
        self.roles = trainable_roles(team.roles)
        if not self.roles:
            raise RolecastError(f"{team.path}: no trainable role (trainable: true, an adapter, bound to the model)")
        # The configs were checked when the team loaded; here they become the plugins' models.
        try:  # checked when the team loaded, but --set may have changed the options since
            self.trainer = build_trainer(self.registry.get("trainers", self.cfg.trainer), self.roles, self.cfg.trainer_config,
                                         self.cfg.group_size * self.cfg.groups_per_step)
        except ValueError as exc:
            raise RolecastError(f"{team.path}: training.trainer_config: {exc}") from None
        self.reward_fn = self.registry.get("rewards", self.cfg.reward)
        self.reward_config = config_model(self.reward_fn).model_validate(self.cfg.reward_config)
        lora = LoraConfig(**{**self.cfg.lora.model_dump(), "target_modules": tuple(self.cfg.lora.target_modules)})
        with said_as(RunFailed, f"trainer plugin {self.cfg.trainer!r}: learners"):  # before any step: no checkpoint to resume
            learners = self.trainer.learners()
        self.clients = {a: service.create_lora_training_client(a, lora) for a in learners}
        if self.cfg.joint_passes is not None:  # else the service's default for its device
            service.joint_passes = self.cfg.joint_passes
        self.rollouts = rollouts  # None: episodes play here; else rollout workers (workers.RayRollouts)
        self.policies = build_policies(team, {}, lambda: engine, self.registry)
        self.eval_team, self.eval_policies, self.eval_opponent_role = team, self.policies, None
        overrides: dict = {}
        if self.cfg.eval_opponent:  # evaluations rebind the protocol's opponent role
            self.eval_team, self.eval_opponent_role, checkpoint = bind_opponent(team, self.cfg.eval_opponent, overrides)
            if checkpoint is not None:
                self._load(CHECKPOINT_ADAPTER, checkpoint, f"training.eval_opponent {self.cfg.eval_opponent}")
            self.eval_policies = build_policies(self.eval_team, overrides, lambda: engine, self.registry)
        self.play = rollouts.bind(team, {}) if rollouts else None
        self.play_eval = rollouts.bind(self.eval_team, overrides) if rollouts else None
        self.concurrency = team.config.concurrency * (rollouts.workers if rollouts else 1)
        self.published: dict[str, int] = {}  # learner adapter -> the version last published to the samplers
        self._unwritten: set[str] = set()  # learners whose sampler dir lags the engine (_publish), until a checkpoint
        self._engine_seen: dict[str, float] = {}  # the engine's stats at the last metrics row (_engine_work)
        self._frozen: set[str] = set()  # snapshots in the engine and on the workers that opponent_adapters listed
        self._retiring: dict[str, list[asyncio.Task]] = {}  # snapshots the trainer let go -> rollouts that may play them
        self.run_dir = options.out_dir
        self.steps = options.steps or self.cfg.steps
        self.metrics = MetricsWriter(self.run_dir)
        # the run's bar, open while it runs (_run): its rollouts and evaluations count episodes beneath
        self.bar = progress_bar(False)

    # -- the loop --------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        try:
            result = await self._run()
        except BaseException:  # a failed run's writer too: it holds a thread and the event file open;
            with contextlib.suppress(OSError):  # its own fault (the same full disk) must not replace
                self.metrics.close()  # the error that stopped the run, which the user is to read
            raise
        self.metrics.close()
        return result

    async def _run(self) -> dict[str, Any]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        start = await self._resume() if self.options.resume else 0  # the first step still to run
        if start > self.steps:
            return await self._finished()
        self.bar = progress_bar(self.options.progress)
        with self.bar:
            first = max(start, 1)  # its run's name: compare's strategies each have theirs
            task = self.bar.add_task(f"{self.run_dir.name} steps", total=self.steps, completed=first - 1)  # those done
            if start == 0:
                seed_rng(self.options.seed)
                self._write_config()
                for adapter, client in self.clients.items():
                    with said_as(RunFailed, f"trainer plugin {self.cfg.trainer!r}: init_noise"):
                        std = self.trainer.init_noise(adapter)
                    if std:
                        await (await client.perturb_async(std, f"{self.options.seed}:{adapter}")).result_async()
                await self._publish_all()
                await self.evaluate(0)
            ahead: dict[int, asyncio.Task] = {}  # async training: later steps' rollouts, sampling meanwhile
            try:
                for step in range(first, self.steps + 1):
                    for later in range(step, min(step + self.cfg.max_staleness, self.steps) + 1):
                        if later not in ahead:
                            ahead[later] = asyncio.create_task(self.rollout(later))
                    await self.train_step(step, ahead.pop(step))
                    self._retire(ahead.values())
                    if self.cfg.eval_every and step % self.cfg.eval_every == 0 and step != self.steps:
                        await self.evaluate(step)
                    if step % self.cfg.checkpoint_every == 0 or step == self.steps:
                        self.checkpoint(step)
                    self.bar.update(task, completed=step)
            finally:
                for pending in ahead.values():
                    pending.cancel()
            return await self.evaluate(self.steps)

    async def train_step(self, step: int, rollout: Awaitable[list[list[EpisodeRecord]]] | None = None) -> dict[str, Any]:
        """One step on ``rollout``'s episodes (by default, a rollout of this step started now)."""
        t0 = time.perf_counter()
        groups = await (rollout or self.rollout(step))
        episodes = [ep for g in groups for ep in g]
        if first := every_episode_failed(episodes):
            folder = self.run_dir / "rollouts" / f"step-{step:06d}"
            raise RunFailed(f"step {step}: every episode failed, leaving nothing to train on; the first: {first.error} "
                            f"(transcripts in {folder}). Fix the cause, then --resume from the last checkpoint")
        rewards = checked(self._rewards(groups), self.team.roles, "reward", self.cfg.reward, "its reward")
        rewards, repeated = penalise_repetition(groups, rewards, self.cfg.repetition_penalty)
        # a failed episode's rewards are placeholders: in no baseline, trained on by no one
        finished = [[not ep.failed for ep in g] for g in groups]
        with blamed("trainer", self.cfg.trainer, "advantages"):
            advantages = self.trainer.step_advantages([[{r: rw[r] for r in self.roles} for rw in g] for g in rewards], finished)
        advantages = checked(advantages, self.roles, "trainer", self.cfg.trainer, "advantages", like=groups)
        extra = combined(
            turn_advantages(groups, list(self.roles), self.cfg.turn_credit) if self.cfg.turn_credit else None,
            history_advantages(groups, rewards, list(self.roles), self.cfg.history_credit) if self.cfg.history_credit else None)
        t_roll = time.perf_counter() - t0
        row: dict[str, Any] = {"step": step, "kind": "train"}
        results = [(ep, rw) for g, rws in zip(groups, rewards) for ep, rw in zip(g, rws) if not ep.failed]
        for role in self.team.roles:  # over the episodes it took part in, as summary.json's means: none, no figure
            if not (taking := [(ep, rw) for ep, rw in results if ep.in_episode(role)]):
                continue
            row[f"reward/{role}"] = sum(rw[role] for _, rw in taking) / len(taking)
            if self.cfg.reward != "env" or role in self.cfg.repetition_penalty:  # what the env paid, beside what trained
                row[f"env_reward/{role}"] = sum(ep.rewards.get(role, 0.0) for ep, _ in taking) / len(taking)
        turns = [t for ep, _ in results for t in ep.turns]  # a failed episode's are cut short by its fault, as in summary.json
        row["valid_turn_rate"] = sum(t.valid for t in turns) / max(len(turns), 1)
        for role in self.roles:  # the env's scores of the role's moves, where it scores them
            if scores := [t.score for t in turns if t.role == role and t.score is not None]:
                row[f"turn_score/{role}"] = sum(scores) / len(scores)
        row["episodes"] = len(episodes)
        row.update(_failures(episodes))  # not trained on
        row.update(repeated)
        with blamed("trainer", self.cfg.trainer, "adapters_to_train"):
            trained = learning(self.trainer.adapters_to_train(step), self.clients, self.cfg.trainer)
        self._write_credit(step, groups, rewards, advantages, extra, trained)
        row.update(await self._update(step, trained, groups, advantages, extra))
        with blamed("trainer", self.cfg.trainer, "after_step"):
            said = self.trainer.after_step(step, [ep for ep, _ in results], [rw for _, rw in results], self._snapshot)
        row["rollout_s"] = round(t_roll, 3)
        row["step_s"] = round(time.perf_counter() - t0, 3)
        row.update(self._engine_work())
        row.update(measured(said, "trainer", self.cfg.trainer, "after_step", taken=row))
        self.metrics.write(row)
        return row

    def _rewards(self, groups: list[list[EpisodeRecord]]) -> list[list[dict[str, float]]]:
        """The reward plugin's rewards (per group, per episode, per role); a failed episode's are the
        env's placeholders: its outcome is what the env never gave, and the plugin is not asked."""
        roles = list(self.team.roles)
        with blamed("reward", self.cfg.reward, "its reward"):
            return [[{r: ep.rewards.get(r, 0.0) for r in roles} if ep.failed else self.reward_fn(ep, roles, self.reward_config)
                     for ep in g] for g in groups]

    def _engine_work(self) -> dict[str, float]:
        """What the local engine did since the last metrics row (``HFEngine.stats``: prompt tokens
        computed and reused, tokens decoded, seconds in each), as ``engine/...`` metrics; where
        rollouts run on workers, or on an engine without stats, nothing. In async training a
        step's row also counts the later steps' rollouts sampled meanwhile."""
        stats = getattr(self.engine, "stats", None)
        if self.rollouts is not None or stats is None:
            return {}
        now = stats.as_dict()
        last, self._engine_seen = self._engine_seen, now
        keys = ("prefill_passes", "prefill_tokens", "prefix_hit_tokens", "decode_tokens", "prefill_s", "decode_s")
        return {f"engine/{k}": round(now[k] - last.get(k, 0), 3) for k in keys}

    def _write_credit(self, step: int, groups, rewards, advantages, extra: list[list[TurnAdvantages]] | None,
                      trained: list[str]) -> None:
        """rollouts/step-N/credit.jsonl: per episode, each role's reward, the advantage the trainer
        gave it, the turn-level credit on top (turn_credit, history_credit), the adapter that played it, and
        whether that adapter trained this step: how credit was assigned, per role."""
        lines = []
        for g, group in enumerate(groups):
            for e, episode in enumerate(group):
                lines.append(json.dumps({
                    "episode": episode.id, "group": g,
                    "rewards": {r: rewards[g][e][r] for r in self.roles},
                    "advantages": {r: advantages[g][e].get(r, 0.0) for r in self.roles},
                    **({"turn_advantages": extra[g][e]} if extra is not None else {}),
                    "adapters": {r: self._played(episode, r) for r in self.roles},
                    "trained": [] if episode.failed else sorted(r for r in self.roles if self._played(episode, r) in trained),
                }))
        folder = self.run_dir / "rollouts" / f"step-{step:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "credit.jsonl", "".join(line + "\n" for line in lines))

    async def rollout(self, step: int) -> list[list[EpisodeRecord]]:
        rng = random.Random(f"{self.options.seed}:tasks:{step}")
        chosen = [rng.choice(self.team.tasks) for _ in range(self.cfg.groups_per_step)]
        size = self.cfg.group_size
        team = replace(self.team, tasks=[t for t in chosen for _ in range(size)])
        # chosen now: with max_staleness, the last step's after_step (new snapshots, ratings) runs while
        # these play, and would otherwise pick the opponents by timing
        with blamed("trainer", self.cfg.trainer, "adapters_for"):
            adapters = seated([self.trainer.adapters_for(step, i) for i in range(len(team.tasks))], self._served(),
                              self.cfg.trainer, "adapters_for")
        result = await run_team(team, self.policies, RunOptions(
            episodes=len(team.tasks),
            seed=derive_seed(self.options.seed, step),
            out_dir=self.run_dir / "rollouts" / f"step-{step:06d}",
            concurrency=self.concurrency,
            episode_timeout_s=self.team.config.episode_timeout_s,
            bar=self.bar,
            adapters_for=adapters.__getitem__,
            play=self.play,
        ))
        return [result.episodes[g * size:(g + 1) * size] for g in range(len(chosen))]

    async def _update(self, step: int, adapters: list[str], groups: list[list[EpisodeRecord]], advantages,
                      extra: list[list[TurnAdvantages]] | None) -> dict[str, Any]:
        """Each adapter's datums in ``ppo_epochs`` passes of ``minibatches`` optimizer steps each,
        then publish. With one of each (the default) that is a single on-policy step; after the
        first optimizer step the policy has moved, the importance ratios leave 1 and PPO's clip
        bites. The adapters' k-th minibatches go to the service in one ``forward_backward_many``
        (sharing passes with ``joint_passes``), then each adapter takes its own optimizer step."""
        metrics: dict[str, Any] = {}
        plans = {a: self._datums(a, groups, advantages, extra) for a in adapters}
        for adapter, (items, _, stale) in plans.items():
            if not items:
                metrics.update({f"{adapter}/datums": 0, **stale})
        live = {a: items for a, (items, _, _) in plans.items() if items}
        epochs = self.cfg.ppo_epochs
        rngs = {a: random.Random(f"{self.options.seed}:minibatches:{step}:{a}") for a in live}
        passes: dict[str, list[dict[str, float]]] = {a: [] for a in live}
        for _ in range(epochs):
            chunks = {}
            for adapter, items in live.items():
                order, parts = list(items), min(self.cfg.minibatches, len(items))
                if epochs > 1 or parts > 1:
                    rngs[adapter].shuffle(order)
                # sizes a datum apart, so there are `parts` of them (chunks of ceil(n / parts) may be fewer)
                chunks[adapter] = [order[i * len(order) // parts:(i + 1) * len(order) // parts] for i in range(parts)]
            results: dict[str, list[dict[str, float]]] = {a: [] for a in live}
            for k in range(max((len(c) for c in chunks.values()), default=0)):
                done = await self._minibatch({a: c[k] for a, c in chunks.items() if k < len(c)})
                for adapter, row in done.items():
                    results[adapter].append(row)
            for adapter, rows in results.items():
                passes[adapter].append(_pass_summed(rows))
        for adapter, items in live.items():
            metrics.update({f"{adapter}/{k}": v for k, v in _mean(passes[adapter]).items()})
            if epochs > 1:  # how far each pass strayed from the sampler
                for e, p in enumerate(passes[adapter], 1):
                    metrics.update({f"{adapter}/epoch{e}/{k}": p[k] for k in ("clip_fraction", "approx_kl") if k in p})
            if skipped := metrics.get(f"{adapter}/skipped_step"):
                log.warning("training.step_skipped", step=step, adapter=adapter, share=skipped,
                            reason="a non-finite gradient: the weights did not move")
            metrics[f"{adapter}/datums"] = len(items)
            metrics[f"{adapter}/version"] = await self._publish(adapter)
            _, lags, stale = plans[adapter]
            if self.cfg.max_staleness:
                metrics[f"{adapter}/staleness"] = sum(lags) / len(lags) if lags else 0.0
            metrics.update(stale)
        return metrics

    def _datums(self, adapter: str, groups: list[list[EpisodeRecord]], advantages,
                extra: list[list[TurnAdvantages]] | None) -> tuple[list, list[int], dict]:
        """The adapter's ((sampling temperature, role with loss options of its own or None), datum)
        pairs from the step's episodes, the lag behind the learner of each attempt they train on,
        and, in async training, how many attempts were dropped as too stale (sampled more than
        ``max_staleness`` versions behind; a retried turn's attempts count each)."""
        current = self.published[adapter]
        options = DatumBuildOptions(invalid=self.cfg.invalid, invalid_advantage=self.cfg.invalid_advantage,
                                    min_version=current - self.cfg.max_staleness)
        items: list[tuple[tuple[float, str | None], Datum]] = []
        for g, group in enumerate(groups):
            for e, episode in enumerate(group):
                if episode.failed:  # its turns ended in a fault: no reward speaks for them
                    continue
                for role in self.roles:
                    if self._played(episode, role) != adapter:
                        continue
                    t = self.team.roles[role].config.policy.sampling.temperature
                    key = (t if t > 0 else 1.0, role if role in self.cfg.role_loss_config else None)
                    turn_extra = extra[g][e][role] if extra is not None else None
                    items += [(key, d) for d in role_datums(episode, role, advantages[g][e][role], options, turn_extra)]
        stale = {f"{adapter}/stale_dropped": options.stats["stale"]} if self.cfg.max_staleness else {}
        return items, [current - v for v in options.versions], stale

    def _played(self, episode: EpisodeRecord, role: str) -> str:
        """The adapter that played ``role`` in ``episode``: the trainer's override, else the role's own."""
        return episode.adapters.get(role, self.roles[role])

    async def _minibatch(self, batches: dict[str, list[tuple[tuple[float, str | None], Datum]]]) -> dict[str, dict[str, float]]:
        """One pass over every adapter's batch (a call per adapter, sampling temperature, since
        logprobs are taken at it, and role with loss options of its own), then each adapter's
        optimizer step."""
        calls, owners = [], []
        for adapter, items in batches.items():
            by_key: dict[tuple[float, str | None], list[Datum]] = defaultdict(list)
            for key, d in items:
                by_key[key].append(d)
            # a mean (token-mean, sequence-mean) is over the adapter's whole batch, whatever calls it takes
            whole = {"batch_tokens": max(float(sum(d.mask().sum() for _, d in items)), 1.0), "batch_sequences": len(items)}
            for (temperature, role), data in by_key.items():
                own = self.cfg.role_loss_config.get(role, {}) if role else {}
                config = {**RECIPE_LOSS_DEFAULTS, **self.cfg.loss_config, **own, "temperature": temperature, **whole}
                calls.append((self.clients[adapter], data, self.cfg.loss, config))
                owners.append(adapter)
        outs = await (await self.service.forward_backward_many_async(calls)).result_async()
        steps = {a: await self.clients[a].optim_step_async(AdamParams(**self.cfg.adam.model_dump())) for a in batches}
        opts = {a: await future.result_async() for a, future in steps.items()}

        def metrics() -> dict[str, dict[str, float]]:  # they arrive from a GPU after the calls return
            return {a: {**_calls_summed([o.metrics for o, owner in zip(outs, owners) if owner == a]), **opt.metrics}
                    for a, opt in opts.items()}

        return await asyncio.to_thread(metrics)  # waited for off the event loop, where episodes go on

    async def evaluate(self, step: int) -> dict[str, Any]:
        tasks = self.team.eval_tasks or self.team.tasks
        n = self.cfg.eval_episodes
        team = replace(self.eval_team, tasks=tasks)
        with blamed("trainer", self.cfg.trainer, "eval_adapters_for"):
            adapters = seated([{r: a for r, a in self.trainer.eval_adapters_for(i).items() if r != self.eval_opponent_role}
                               for i in range(n)], self._served(), self.cfg.trainer, "eval_adapters_for")  # chosen now
        result = await run_team(team, self.eval_policies, RunOptions(
            episodes=n, seed=derive_seed(self.options.seed, 999_999), out_dir=self.run_dir / "evals" / f"step-{step:06d}",
            concurrency=self.concurrency, episode_timeout_s=self.team.config.episode_timeout_s, bar=self.bar,
            adapters_for=adapters.__getitem__,
            play=self.play_eval,
        ))
        if first := every_episode_failed(result.episodes):
            raise RunFailed(f"evaluation at step {step}: every episode failed; the first: {first.error} "
                            f"(transcripts in {result.run_dir})")
        # Evaluations report the environment's own rewards, whatever reward training optimises.
        row: dict[str, Any] = {"step": step, "kind": "eval", "episodes": n, **_failures(result.episodes)}
        if self.cfg.reward != "env":  # over the finished episodes, as eval_reward: a failed one's rewards are placeholders
            finished = [ep for ep in result.episodes if not ep.failed]
            (shaped,) = checked(self._rewards([finished]), self.team.roles, "reward", self.cfg.reward, "its reward")
        for role in self.team.roles:
            stats = result.summary["roles"][role]  # the run's own mean and interval of env rewards
            row[f"eval_reward/{role}"] = stats["mean_reward"]
            row[f"eval_ci95/{role}"] = stats["reward_ci95"]  # None: one episode gives no interval
            if self.cfg.reward != "env" and (taking := [rw[role] for ep, rw in zip(finished, shaped) if ep.in_episode(role)]):
                row[f"eval_trained_reward/{role}"] = sum(taking) / len(taking)
        for role, e in evaluate_results(team, result.episodes, result.summary).items():
            row[f"eval_win_rate/{role}"] = e["win_rate"]
        row.update({f"eval_env/{k}": v for k, v in result.summary["env"].items()})
        row["eval_valid_turn_rate"] = result.summary["valid_turn_rate"]
        row.update(self._engine_work())
        self.metrics.write(row)
        # None: a role that took part in no finished episode (a teacher whose domain drew none)
        log.info("evaluation", step=step, **{k: v if v is None else round(v, 4) for k, v in row.items()
                                             if k.startswith(("eval_reward/", "eval_win_rate/"))})
        return row

    # -- sampler, config, checkpoints ------------------------------------------------------------
    def _sampler_dir(self, adapter: str) -> Path:
        return self.run_dir / "sampler" / adapter

    def _snapshot(self, adapter: str, name: str) -> None:
        """Freeze the adapter's current weights as opponent ``name`` (kept on disk for --resume)."""
        path = self.clients[adapter].save_weights(self.run_dir / "pool" / name).result()
        self._load(name, path)

    def _retire(self, pending: Iterable[asyncio.Task]) -> None:
        """Unload the snapshots the trainer no longer keeps (``opponent_adapters``), once no rollout
        that began while it kept them (``pending``: async training's) is still playing: the engine
        stacks every loaded adapter's LoRA into each decode step (lora.SlotLoRA), so a long
        self-play run slowed with every snapshot it had ever taken."""
        with blamed("trainer", self.cfg.trainer, "opponent_adapters"):
            kept = set(self.trainer.opponent_adapters())
        # only snapshots the trainer has listed: one that never lists its own (the hook's default is
        # none) would lose them at once, its games falling back to the base model
        self._frozen |= kept
        for name in self._frozen - kept:
            self._frozen.discard(name)
            self._retiring[name] = [t for t in pending if not t.done()]
        for name, tasks in list(self._retiring.items()):
            if all(t.done() for t in tasks):
                del self._retiring[name]
                self.engine.remove_adapter(name)
                if self.rollouts:
                    self.rollouts.forget(name)

    def _served(self) -> set[str]:
        """The adapters episodes can be seated on: the learners (one not yet published is in no
        engine) and whatever the engine holds (snapshots, the eval opponent's checkpoint)."""
        return set(self.clients) | set(self.engine.versions)

    def _load(self, name: str, path: Path, given: str | None = None) -> None:
        """A frozen adapter into the engine, and to the rollout workers; ``given``: where the user
        named the dir (one it names that the engine refuses is a line saying so, not a traceback)."""
        version = load_adapter(self.engine, name, path, given) if given else self.engine.load_adapter(name, path)
        if self.rollouts:
            self.rollouts.publish(name, path, version)

    async def _publish(self, adapter: str, write: bool = False) -> int:
        """A learner's current weights to the engine and the rollout workers. Workers, and engines
        that load adapters from disk, read its sampler dir, so it is written first. An engine that
        holds the adapter in this process takes the weights as they are, and the dir waits for
        the next checkpoint (``_write_samplers``) unless ``write``: publishing with the file was a
        fifth of a GRPO step on the H100."""
        client = self.clients[adapter]
        if not write and not self.rollouts and client.samples_in_process:
            version = await (await client.push_to_sampler_async()).result_async()
            self._unwritten.add(adapter)
        else:
            folder = self._sampler_dir(adapter)
            version = await (await client.save_weights_for_sampler_async(folder)).result_async()
            self._unwritten.discard(adapter)
            if self.rollouts:
                self.rollouts.publish(adapter, folder, version)
        self.published[adapter] = version
        return version

    async def _publish_all(self) -> None:
        for adapter in self.clients:
            await self._publish(adapter, write=True)

    def _write_samplers(self) -> None:
        """The sampler dirs that lag their engine's weights, brought up to date."""
        for adapter in sorted(self._unwritten):
            self.clients[adapter].save_weights(self._sampler_dir(adapter)).result()
        self._unwritten.clear()

    def _write_config(self) -> None:
        config = {"recipe": self.team.resolved(), "run": {"seed": self.options.seed, "model": self.options.model,
                                                          "dtype": self.options.dtype, "steps": self.steps, **self.options.extra}}
        write_yaml(self.run_dir / "config.yaml", config)

    def _record_steps(self) -> None:
        """A resume with more --steps makes them the run's: a later --resume (after a crash in the
        added steps) defaults to them, and `rolecast report` counts them."""
        config = recorded_run(self.run_dir)  # None, not a traceback, where a hand deleted it
        if config is not None and (config.get("run") or {}).get("steps") != self.steps:
            config["run"] = {**(config.get("run") or {}), "steps": self.steps}
            write_yaml(self.run_dir / "config.yaml", config)

    def checkpoint(self, step: int) -> Path:
        self._write_samplers()
        root = self.run_dir / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        name = f"step-{step:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
        try:
            for adapter, client in self.clients.items():
                client.save_state(tmp / "adapters" / adapter).result()
            with blamed("trainer", self.cfg.trainer, "state_dict"):  # its state's fault, not the disk's
                state = json.dumps({"step": step, "trainer": self.trainer.state_dict(), "published": self.published})
            write_atomic(tmp / "trainer.json", state)
            save_rng(tmp / "rng.pt")
            fsync_dir(tmp)  # the adapters' dirs fsync themselves (TrainingClient.save_state)
            final = root / name
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(root)  # the rename: before the older checkpoints are pruned
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        write_atomic(root / "latest", name)
        # zero-padded: oldest first; and the temp dirs of saves a kill cut short (ours is renamed)
        for old in [*sorted(root.glob("step-*"))[: -self.cfg.keep_checkpoints], *root.glob(".step-*.tmp-*")]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint", step=step, path=str(root / name))
        return root / name

    async def _resume(self) -> int:
        """Load the last checkpoint; the first step still to run. A run stopped before its first
        checkpoint starts again from step 0 in the same dir (its rows are dropped)."""
        rng: list[dict] = []

        def load(folder: Path, state: dict[str, Any]) -> None:  # a file that does not read passes the checkpoint over
            if state["step"] > self.steps:
                raise RolecastError(f"--resume: {self.run_dir} is at step {state['step']}, past --steps {self.steps}")
            for adapter, client in self.clients.items():
                client.load_state(folder / "adapters" / adapter).result()
            rng[:] = [read_saved(folder / "rng.pt", read_rng)]  # set last

        found = self._last_checkpoint(load)
        if found is None:
            log.warning("no checkpoint yet: starting again from step 0", run_dir=str(self.run_dir))
            self.metrics.truncate_after(-1)
            return 0
        folder, state = found
        with blamed("trainer", self.cfg.trainer, f"load_state_dict of {folder.name}/trainer.json"):
            self.trainer.load_state_dict(state["trainer"])
        published = state["published"] if "published" in state else self._published_in_rows(state["step"])
        for adapter, version in published.items():  # the weights go back under their number
            self.engine.continue_versions(adapter, version - 1)
        with blamed("trainer", self.cfg.trainer, "opponent_adapters"):  # as at every step: a fault is one line
            opponents = list(self.trainer.opponent_adapters())
        for name in opponents:  # e.g. self-play's snapshots back into the engine
            try:
                self._load(name, self.run_dir / "pool" / name)
            except (OSError, ValueError) as exc:  # deleted or damaged by hand: nothing to play it with
                raise RolecastError(f"--resume: opponent {name!r} of {folder.name} does not load from "
                                    f"{self.run_dir / 'pool' / name}: {exc}") from None
        await self._publish_all()
        # last: nothing the resume does may draw from the RNG between the checkpoint's state and the next step
        set_rng(rng[0])
        self.metrics.truncate_after(state["step"])
        self._record_steps()
        log.info("resumed", step=state["step"], checkpoint=str(folder))
        return int(state["step"]) + 1

    def _published_in_rows(self, step: int) -> dict[str, int]:
        """The versions published by ``step``, where its checkpoint is an older rolecast's, whose
        trainer.json kept none: the last each learner's rows record (they start again otherwise,
        one number naming two sets of weights)."""
        rows = read_metrics(self.run_dir) if (self.run_dir / "metrics.jsonl").is_file() else []
        return {adapter: row[key] for row in rows if row["step"] <= step
                for adapter in self.clients if type(row.get(key := f"{adapter}/version")) is int}

    def _last_checkpoint(self, load: Callable[[Path, dict[str, Any]], None]) -> tuple[Path, dict[str, Any]] | None:
        # every file an adapter's state load reads: one deleted by hand passes the checkpoint over, not a
        # traceback halfway through loading it
        files = [f"adapters/{a}/{f}" for a, client in self.clients.items() for f in client.STATE_FILES]
        return last_checkpoint(self.run_dir, "--resume", ["rng.pt", *files], load)

    async def _finished(self) -> dict[str, Any]:
        """A resumed run that had trained all its steps: its final evaluation row, made now only if
        the run stopped before writing it."""
        final = [row for row in read_metrics(self.run_dir) if row["kind"] == "eval" and row["step"] == self.steps]
        log.info("the run had finished", step=self.steps)
        return final[-1] if final else await self.evaluate(self.steps)


def last_checkpoint(run_dir: Path, flag: str, needs: Sequence[str] = (),
                    load: Callable[[Path, dict[str, Any]], None] | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of ``run_dir`` that is whole (its trainer.json reads, the files
    ``needs`` names are there, and ``load`` of it raises no OSError or ValueError: a file that does
    not read; loading the one before overwrites what it loaded), and its state; None where there
    is none. A checkpoint is written whole or not at all (``TrainingRun.checkpoint``), so a damaged
    one was damaged afterwards: it is passed over for the one before, with a warning; where every
    one is damaged, ``flag``'s command stops in one line (a resume would start again and drop the
    run's rows), as where ``latest`` names one and none is left."""
    folders = sorted((run_dir / "checkpoints").glob("step-*"), reverse=True)  # zero-padded: newest first
    problems = []
    for folder in folders:
        try:
            state = json.loads((folder / "trainer.json").read_text())
            if not (isinstance(state, dict) and type(state.get("step")) is int):  # JSON, but overwritten since
                raise ValueError("trainer.json holds no step")
            if missing := [need for need in needs if not (folder / need).exists()]:
                raise FileNotFoundError(f"no {missing[0]}")
            if load is not None:
                load(folder, state)
            return folder, state
        except (OSError, ValueError) as exc:
            problems.append(f"{folder.name}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}")
            log.warning("checkpoint damaged: trying the one before", checkpoint=str(folder), problem=problems[-1])
    if folders:
        raise RolecastError(f"{flag}: no whole checkpoint in {run_dir / 'checkpoints'} ({'; '.join(problems)})")
    latest = run_dir / "checkpoints" / "latest"
    if latest.is_file():  # written after a checkpoint is whole: every one was deleted since, not never made
        raise RolecastError(f"{flag}: {latest} names {latest.read_text().strip()}, which is not there: "
                            "the run's checkpoints were deleted")
    return None


def _failures(episodes: list[EpisodeRecord]) -> dict[str, int]:
    """How many of ``episodes`` errored or timed out: faults, not results, in no reward mean."""
    return {"episodes_errored": sum(ep.status == "error" for ep in episodes),
            "episodes_timed_out": sum(ep.status == "timeout" for ep in episodes)}


def _calls_summed(rows: list[dict[str, float]]) -> dict[str, float]:
    """An adapter's metrics from its calls' (one per temperature and role with loss options of
    its own): the losses (each call's share of the batch's) and token counts add up, the
    per-token means are weighted by each call's tokens, over the calls that computed them (a
    role's own kl or entropy is its tokens' mean, not diluted by the other roles' tokens)."""
    out = {k: sum(row[k] for row in rows) for k in ("loss", "loss:sum", "tokens")}
    for key in {k for row in rows for k in row} - set(out):
        out[key] = _token_mean(rows, key)
    return out


def _pass_summed(rows: list[dict[str, float]]) -> dict[str, float]:
    """An adapter's metrics over a pass from its minibatches' (an optimizer step each): the token
    counts and summed losses add up and the per-token means are weighted by each minibatch's
    tokens, so they are the pass's (its tokens, its clip fraction); the rest (the loss, each
    minibatch's own mean; grad_norm, skipped_step) are means over the optimizer steps."""
    out = _mean(rows)
    for key in out:
        if key in ("tokens", "loss:sum"):
            out[key] = sum(row[key] for row in rows if key in row)
        elif key in MEAN_NAMED or key.endswith("_mean"):
            out[key] = _token_mean(rows, key)
    return out


def _token_mean(rows: list[dict[str, float]], key: str) -> float:
    """A per-token metric's mean over the tokens of the rows that computed it."""
    having = [row for row in rows if key in row]
    return sum(row[key] * row["tokens"] for row in having) / (sum(row["tokens"] for row in having) or 1.0)


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    """Key by key mean of metric dicts (a key missing from some is averaged over those that have it)."""
    sums: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for k, v in row.items():
            sums[k].append(v)
    return {k: sum(v) / len(v) for k, v in sums.items()}
