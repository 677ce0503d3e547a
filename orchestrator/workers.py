"""Rollout workers on Ray: episodes played by N actors, each with its own engine.

    pool = RayRollouts(RayOptions(address="local", workers=2), model="smollm2-135m")
    play = pool.bind(team, overrides)            # the team's roles and bindings, on every worker
    pool.publish("coder", sampler_dir, version)  # new LoRA weights: sent once, fetched by each worker
    record = await play(record)                  # one episode, on worker record.index % N

The driver keeps everything that writes: transcripts, metrics, checkpoints, training. A worker
gets a team once (``bind``), adapters as PEFT files through Ray's object store with the driver's
version number (``publish``; a worker fetches only the ones that changed, before its next
episode), and episodes one at a time; an episode's turns come back numbered with the driver's
adapter versions, so a transcript says which published weights sampled each turn. Episode i
always goes to worker i mod N, and sampling seeds come from the episode, so a run with workers
samples what the single-process run samples (up to the last bits of batched arithmetic).

A worker that dies, while playing or between episodes, is replaced (its teams bound and adapters
sent again) and its unfinished episodes re-played there from the start: twice beside the worker's
other episodes, then with the worker to itself, so that an episode that kills its worker every
time fails alone, and not the episodes that shared the worker with it. An episode that raised on a
live worker is a result (status ``error``), as it is without Ray. Sandboxes run inside the worker
that plays the episode.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import threading
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from sandboxes.pool import scratch_root

from .errors import RolecastError, WorkersLost
from .transcript import EpisodeRecord, error_text

log = structlog.get_logger()

# An episode whose worker dies is played again: this often beside the worker's other episodes (the
# death may be another's doing), then this often with the worker to itself, where a death is its own.
SHARED_TRIES, ALONE_TRIES = 2, 2


@dataclass
class RayOptions:
    address: str = "local"  # "local": start a Ray instance in this process; else a cluster address ("auto", ray://...)
    workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0  # 1 on a GPU cluster: each worker its own GPU


def start_env() -> None:
    """Before a local Ray starts: Ray runs its workers at niceness 15 by default, so that its own
    daemons stay responsive; here the workers are the main compute, and at 15 the trainer in the
    driver starves them (an engine took 80 s to load instead of 9 on two busy cores)."""
    os.environ.setdefault("RAY_worker_niceness", "0")


class RolloutWorker:
    """The body of a Ray actor (async: its episodes share the engine's batches)."""

    def __init__(self, model: str, dtype: str, seed: int, backend: str, device: str, threads: int, lora_rank: int = 0):
        import torch

        from .engines.load import load_engine

        if threads:
            torch.set_num_threads(threads)
        self.engine = load_engine(model, dtype, seed, backend, device=device, lora_rank=lora_rank)
        self.teams: dict[str, tuple[Any, dict]] = {}
        self.loaded: dict[str, int] = {}  # adapter -> driver version held
        self.driver_version: dict[tuple[str, int], int] = {}  # (adapter, engine version) -> driver version
        # in the process's scratch: a worker Ray kills leaves it behind, for the next one to remove
        self.folder = Path(tempfile.mkdtemp(prefix="worker-", dir=scratch_root()))

    def bind(self, key: str, team: Any, overrides: dict) -> None:
        from .rollout import build_policies

        self.teams[key] = (team, build_policies(team, overrides, lambda: self.engine))

    def sync(self, adapters: dict[str, tuple[int, Any]]) -> None:
        """Load every adapter whose driver version differs from the one held, and unload those
        ``adapters`` no longer holds; it maps name -> (version, object ref of its files)."""
        import ray

        for name in set(self.loaded) - set(adapters):  # a snapshot the trainer let go (RayRollouts.forget)
            self.engine.remove_adapter(name)
            shutil.rmtree(self.folder / name, ignore_errors=True)
            del self.loaded[name]
            self.driver_version = {k: v for k, v in self.driver_version.items() if k[0] != name}
        for name, (version, ref) in adapters.items():
            if self.loaded.get(name) == version:
                continue
            folder = self.folder / name / str(version)
            folder.mkdir(parents=True, exist_ok=True)
            for file, data in ray.get(ref).items():
                (folder / file).write_bytes(data)
            self.driver_version[(name, self.engine.load_adapter(name, folder))] = version
            if name in self.loaded:  # only the held version stays on disk (an engine may reread it)
                shutil.rmtree(self.folder / name / str(self.loaded[name]), ignore_errors=True)
            self.loaded[name] = version

    async def play(self, key: str, record: EpisodeRecord) -> EpisodeRecord:
        from .episode import run_episode

        team, policies = self.teams[key]
        try:
            await run_episode(team, policies, record)
        except Exception as exc:  # as run_team records it: raised, Ray's traceback would replace the turns taken
            record.status, record.error = "error", error_text(exc)
        for turn in record.turns:
            for attempt in turn.attempts:
                if attempt.adapter is not None and attempt.adapter_version:
                    attempt.adapter_version = self.driver_version.get((attempt.adapter, attempt.adapter_version))
        return record

    def pid(self) -> int:
        return os.getpid()

    def remove_folder(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A cluster address that nothing answers at fails here in seconds: Ray itself retries a dead
    address for about a quarter of an hour, printing only its own C++ warnings."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")  # an IPv6 address, as Ray takes it ("[::1]:6379"): the brackets are no host name
    if not (host and port.isdigit()):  # "auto" and other forms: Ray finds the cluster itself
        return
    try:  # a connection that times out is no cluster either: a firewall dropping it, say
        with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
            # Ray speaks gRPC (HTTP/2, binary frames) there: a reply in text is a web server's, the
            # common mistake of the dashboard's port (8265) for the cluster's (6379)
            conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            try:
                reply = conn.recv(16)
            except socket.timeout:
                return  # a server that says nothing first: let Ray try it
    except OSError as exc:
        raise RolecastError(f"--ray {address}: no Ray cluster answers there ({exc.strerror or exc}); start one "
                            f"with `ray start --head`, or use --ray local") from None
    if reply and all(32 <= b < 127 or b in b"\t\r\n" for b in reply):
        raise RolecastError(f"--ray {address}: a web server answers there, not a Ray cluster (the dashboard is "
                            f"port 8265; give the head's address, HOST:6379, or ray://HOST:10001)")


class _Sharing:
    """Who plays on one worker: any number of episodes together, or one alone. One waiting to play
    alone holds newcomers back, so it is not kept waiting by a stream of them."""

    def __init__(self) -> None:
        self.playing = 0  # episodes in flight; -1: one alone
        self.waiting_alone = 0
        self.changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def turn(self, alone: bool):
        async with self.changed:
            if alone:
                self.waiting_alone += 1
                try:
                    await self.changed.wait_for(lambda: self.playing == 0)
                finally:
                    self.waiting_alone -= 1
                self.playing = -1
            else:
                await self.changed.wait_for(lambda: self.playing >= 0 and not self.waiting_alone)
                self.playing += 1
        try:
            yield
        finally:
            async with self.changed:
                self.playing = 0 if alone else self.playing - 1
                self.changed.notify_all()


class RayRollouts:
    """The driver's side: starts (or joins) Ray, owns the workers, replaces the ones that die."""

    worker = RolloutWorker  # the actors' class (a test gives one that fails on cue)

    def __init__(self, options: RayOptions, *, model: str, dtype: str = "auto", seed: int = 0, backend: str = "hf",
                 device: str = "cpu", lora_rank: int = 0):
        try:
            import ray
        except ImportError:
            raise RolecastError("--ray needs Ray: pip install 'rolecast[ray]'") from None
        if options.workers < 1:
            raise RolecastError(f"--rollout-workers {options.workers}: needs at least 1")
        self.ray, self.options = ray, options
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if options.address == "local":
                start_env()
                kwargs["address"] = "local"  # else Ray joins the cluster RAY_ADDRESS or `ray start` left here
                kwargs["num_cpus"] = max(os.cpu_count() or 1, int(options.workers * options.cpus_per_worker + 0.999))
            else:
                check_reachable(options.address)
                kwargs["address"] = options.address
            ours = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
            try:
                ray.init(**kwargs)
            # ValueError: an address Ray cannot parse ("host:abc"); RuntimeError: a scheme it has no client
            # for ("tcp://head")
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise RolecastError(f"--ray {options.address}: {exc}") from None
            if ours is not None:  # Ray's own handler exits at once (code 15): the run's clean-up would not run
                signal.signal(signal.SIGTERM, ours)
        self._check_resources()
        self.node = ray.get_runtime_context().get_node_id()  # this machine's Ray node, whose death _check_nodes reports
        threads = max(1, int(options.cpus_per_worker)) if device == "cpu" else 0
        self._actor_class = ray.remote(num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker,
                                       max_restarts=0)(self.worker)
        self._args = (model, dtype, seed, backend, device, threads, lora_rank)
        self.teams: dict[str, tuple[Any, dict]] = {}
        self.adapters: dict[str, tuple[int, Any]] = {}  # name -> (driver version, ref to its files)
        self.changes = 0  # bumped by every publish; a worker is synced when it has seen the latest
        self.actors = [self._actor_class.remote(*self._args) for _ in range(options.workers)]
        log.info("ray.rollout_workers", workers=options.workers, device=device, address=options.address,
                 torch_threads=threads or None)
        self.generation = [0] * options.workers
        self.seen = [-1] * options.workers
        self._per_loop: tuple[Any, list[tuple[asyncio.Lock, _Sharing]]] = (None, [])  # (event loop, per slot)
        self.restarts = 0

    def _check_resources(self) -> None:
        """Workers the cluster cannot place would wait for a CPU or GPU for ever, without a word: on
        this machine's Ray that is an error; a cluster's autoscaler may add nodes, so there a warning."""
        for resource, each in (("CPU", self.options.cpus_per_worker), ("GPU", self.options.gpus_per_worker)):
            need, have = self.options.workers * each, self.ray.cluster_resources().get(resource, 0)
            if need <= have:
                continue
            gpu = resource == "GPU"
            what = (f"--rollout-workers {self.options.workers}{' on a GPU' if gpu else ''}: each worker takes "
                    f"{'a GPU' if gpu else f'{each:g} CPU'} of its own, and this Ray has {have:g}")
            if self.options.address != "local":
                log.warning(f"ray.waiting_for_{resource.lower()}s",
                            note=f"{what}; the workers start when the cluster has {need:g}")
                continue
            if self.started_ray:
                self.ray.shutdown()
            fewer = int(have // each)
            raise RolecastError(f"{what}: use --rollout-workers {fewer} or fewer{', or --device cpu' if gpu else ''}"
                                if fewer >= 1 or not gpu else f"{what}: use --device cpu")

    @property
    def workers(self) -> int:
        return len(self.actors)

    def bind(self, team: Any, overrides: dict) -> Callable[[EpisodeRecord], Awaitable[EpisodeRecord]]:
        """Send ``team`` (with its policy ``overrides``) to every worker; the returned coroutine
        function plays one of its episodes remotely."""
        key = f"team-{len(self.teams)}"
        self.teams[key] = (team, overrides)
        try:
            self.ray.get([actor.bind.remote(key, team, overrides) for actor in self.actors])
        except self.ray.exceptions.RayActorError as exc:  # the engine could not load there: said in one line
            said = re.findall(r"RolecastError: (.+)", str(exc)) or [line for line in str(exc).splitlines() if line.strip()][-1:]
            raise RolecastError(f"a rollout worker could not start: {said[-1] if said else type(exc).__name__}") from None
        except self.ray.exceptions.RayTaskError as exc:  # a binding the driver could check, the worker cannot load
            raise RolecastError(f"a rollout worker cannot bind {team.name}'s roles: {exc.cause} (workers import "
                                "policies and read replay files themselves; in-process plugins are not there)") from None
        except TypeError as exc:  # Ray could not pickle the team or its bindings (a callable holding a lock, say)
            raise RolecastError(f"{team.name}'s roles cannot be sent to the rollout workers: {exc.__cause__ or exc} "
                                "(bind such a policy as python:pkg.mod:fn)") from None

        async def play(record: EpisodeRecord) -> EpisodeRecord:
            return await self._play(key, record)

        return play

    def publish(self, name: str, folder: Path, version: int) -> None:
        """New weights for adapter ``name`` (a PEFT dir): workers load them before their next episode."""
        files = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}
        self.adapters[name] = (version, self.ray.put(files))
        self.changes += 1

    def forget(self, name: str) -> None:
        """Adapter ``name`` is no longer played: workers unload it before their next episode."""
        if self.adapters.pop(name, None) is not None:
            self.changes += 1

    async def _play(self, key: str, record: EpisodeRecord) -> EpisodeRecord:
        slot = record.index % self.workers
        for attempt in range(SHARED_TRIES + ALONE_TRIES):
            generation = None  # of the actor that died; None: it died syncing, and _ready replaced it
            try:
                async with self._slot(slot)[1].turn(alone=attempt >= SHARED_TRIES):
                    actor, generation = await self._ready(slot)
                    ref = actor.play.remote(key, record)
                    try:
                        return await ref
                    except asyncio.CancelledError:  # the episode's timeout: stop it on the worker too
                        self.ray.cancel(ref)
                        raise
            except self.ray.exceptions.RayActorError as exc:
                log.warning("rollout worker died", worker=slot, episode=record.id, alone=attempt >= SHARED_TRIES,
                            error=str(exc).splitlines()[0])
                if generation is not None:
                    await self._replace(slot, generation)
        raise RolecastError(f"episode {record.id}: its rollout worker died {SHARED_TRIES + ALONE_TRIES} times, "
                            f"the last {ALONE_TRIES} with no other episode on it")

    async def _ready(self, slot: int) -> tuple[Any, int]:
        """The slot's actor with every published adapter loaded, and its generation."""
        async with self._slot(slot)[0]:
            actor, generation = self.actors[slot], self.generation[slot]
            if self.seen[slot] != self.changes:
                changes = self.changes
                try:
                    await actor.sync.remote(self.adapters)
                except self.ray.exceptions.RayActorError:  # it died between episodes
                    await self._respawn(slot)
                    raise
                self.seen[slot] = changes
            return actor, generation

    async def _replace(self, slot: int, generation: int) -> None:
        async with self._slot(slot)[0]:
            if self.generation[slot] == generation:  # else another episode of this slot replaced it already
                await self._respawn(slot)

    async def _respawn(self, slot: int) -> None:
        """A new actor in ``slot`` (its lock held), with the teams bound; it loads the adapters before
        its first episode. The old one is killed: Ray also reports a live actor it cannot reach for
        a while as lost, and that one would go on holding its CPU or GPU."""
        await asyncio.to_thread(self._check_nodes)  # a call to the GCS: off the event loop
        self.restarts += 1
        self.ray.kill(self.actors[slot], no_restart=True)
        actor = self._actor_class.remote(*self._args)
        try:
            for key, (team, overrides) in self.teams.items():
                await actor.bind.remote(key, team, overrides)
        except BaseException:  # cancelled (the episode's timeout) with teams unbound: the slot keeps the dead
            self.ray.kill(actor, no_restart=True)  # actor, whose next episode replaces it again
            raise
        self.actors[slot], self.generation[slot], self.seen[slot] = actor, self.generation[slot] + 1, -1

    def _check_nodes(self) -> None:
        """A worker dies with its node (the raylet killed, the machine gone), and a new one would wait
        for a node for ever, without a word: with this machine's Ray node dead, or no node alive in
        the cluster, the run stops (a cluster's autoscaler may replace a node among others)."""
        nodes = self.ray.nodes()
        dead = [node for node in nodes if not node["Alive"]]
        if self.options.address == "local":  # others' nodes, dead long ago or joined since, are not this run's
            dead = [node for node in dead if node["NodeID"] == self.node]
        if dead and (self.options.address == "local" or not any(node["Alive"] for node in nodes)):
            reason = (dead[-1].get("DeathReasonMessage") or "no reason given").splitlines()[0]
            raise WorkersLost(f"the rollout workers' Ray node {dead[-1]['NodeManagerAddress']} died ({reason}); "
                              "a training run continues from its last checkpoint with --resume")

    def _slot(self, slot: int) -> tuple[asyncio.Lock, _Sharing]:
        """The slot's lock (for syncing and replacing its actor) and its sharing, in the running event
        loop: both are bound to the first loop that waits on them, and one pool may serve several
        asyncio.run calls."""
        loop = asyncio.get_running_loop()
        if self._per_loop[0] is not loop:
            self._per_loop = (loop, [(asyncio.Lock(), _Sharing()) for _ in self.actors])
        return self._per_loop[1][slot]

    def close(self) -> None:
        """Remove the workers' adapter folders, stop the workers, and Ray if this pool started it;
        a second call does nothing."""
        if self.actors and self.ray.is_initialized():  # a dead worker's folder goes when the next one starts
            self.ray.wait([actor.remove_folder.remote() for actor in self.actors], num_returns=len(self.actors),
                          timeout=10)
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        if self.started_ray:
            self.ray.shutdown()
            self.started_ray = False
