"""Rollout workers on Ray (orchestrator/workers.py): what two workers sample equals what one
process samples, and a worker killed in the middle of a rollout is replaced with nothing lost."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import random
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from orchestrator.team import load_team
from support import SMALL_TRAINING, credit, lora_state, peft_dir, tiny_engine

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def one_worker(worker, options=None):
    """A pool of one Ray rollout worker of the class ``worker`` (tiny model, fp32; ``options``: a
    local Ray's), closed after."""
    from orchestrator.workers import RayOptions, RayRollouts

    pool = type("Pool", (RayRollouts,), {"worker": worker})(options or RayOptions(workers=1), model="tiny", dtype="float32")
    try:
        yield pool
    finally:
        pool.close()


def light_worker():
    """A rollout worker class with no engine to load: it starts at once where Ray finds it a place."""
    from orchestrator.workers import RolloutWorker

    class Light(RolloutWorker):
        def __init__(self, *args):
            pass

    return Light


def test_a_team_pickles_and_renders_the_same_prompts():
    """Workers receive the team pickled: templates travel as file names and compile again."""
    team = load_team(ROOT / "recipes/code_pair.yaml")
    again = pickle.loads(pickle.dumps(team))
    env = team.make_env(team.tasks[0], random.Random(0))
    role = env.next_role()
    context = team.roles[role].context(team.tasks[0], env.observe(role))
    assert again.roles[role].render(context) == team.roles[role].render(context)
    assert [s.json_schema for s in again.roles.values()] == [s.json_schema for s in team.roles.values()]


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    from orchestrator.workers import start_env

    start_env()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _sampled(run: Path, step: int) -> list[list[tuple]]:
    """Per episode (in index order), each attempt's sampled tokens and adapter version."""
    lines = (run / "rollouts" / f"step-{step:06d}" / "transcripts.jsonl").read_text().splitlines()
    episodes = sorted((json.loads(line) for line in lines), key=lambda e: e["index"])
    return [[(a["token_ids"], a["adapter"], a["adapter_version"]) for t in e["turns"] for a in t["attempts"]]
            for e in episodes]


def test_two_workers_sample_and_train_what_one_process_does(ray_local, cli, tmp_path):
    flags = ["--model", "tiny", "--steps", "2", "--no-progress", "--dtype", "float32", *SMALL_TRAINING,
             "--set", "groups_per_step=2"]
    recipe = ROOT / "recipes/code_pair.yaml"
    code, _, err = cli("train", recipe, *flags, "--out", tmp_path / "here")
    assert code == 0, err
    code, _, err = cli("train", recipe, *flags, "--out", tmp_path / "ray", "--ray", "--rollout-workers", "2")
    assert code == 0, err
    for step in (1, 2):
        assert credit(tmp_path / "ray", step) == credit(tmp_path / "here", step)
        assert _sampled(tmp_path / "ray", step) == _sampled(tmp_path / "here", step)
    # every turn names the published version it was sampled with: 1 before the first update, then 2
    assert {v for e in _sampled(tmp_path / "ray", 2) for _, _, v in e} == {2}
    here = [json.loads(line) for line in (tmp_path / "here" / "metrics.jsonl").read_text().splitlines()]
    there = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("coder/loss") for r in there] == [r.get("coder/loss") for r in here]


def test_a_worker_killed_mid_rollout_is_replaced_and_nothing_is_lost(ray_local, tmp_path):
    from orchestrator.rollout import RunOptions, build_policies, run_team
    from orchestrator.workers import RayOptions, RayRollouts

    team = load_team(ROOT / "recipes/code_pair.yaml")
    options = dict(episodes=8, seed=3, progress=False)
    engine = tiny_engine()

    async def here():
        try:
            return await run_team(team, build_policies(team, {}, lambda: engine), RunOptions(out_dir=tmp_path / "here", **options))
        finally:
            await engine.aclose()

    expected = asyncio.run(here())
    pool = RayRollouts(RayOptions(workers=2), model="tiny", dtype="float32")
    play = pool.bind(team, {})
    killed: list[int] = []

    async def play_then_kill(record):
        played = await play(record)
        if not killed:  # the first episode to finish: every episode of the other worker is unfinished
            killed.append(1 - record.index % 2)
            ray_local.kill(pool.actors[killed[0]])
        return played

    try:
        result = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "ray", play=play_then_kill, **options)))
        assert pool.restarts == 1
        # the same pool serves a second event loop (its locks are per loop)
        again = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "again", play=play, **options)))
    finally:
        pool.close()
    assert [r.status for r in again.episodes] == ["ok"] * 8
    assert pool.restarts == 1
    assert [r.status for r in result.episodes] == ["ok"] * 8
    assert len({r.id for r in result.episodes}) == 8  # each episode once
    lines = (tmp_path / "ray" / "transcripts.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in lines) == list(range(8))
    tokens = [[a.token_ids for t in r.turns for a in t.attempts] for r in result.episodes]
    assert tokens == [[a.token_ids for t in r.turns for a in t.attempts] for r in expected.episodes]


def test_workers_whose_node_died_stop_the_run_in_one_line(ray_local, tmp_path, monkeypatch):
    """A killed raylet takes the node's workers with it, and a replacement would wait for ever for a
    node to start on, the run hanging without a word: the run stops, naming the node and why."""
    from orchestrator.errors import WorkersLost
    from orchestrator.rollout import RunOptions, run_team
    from orchestrator.workers import RayOptions, RayRollouts

    team = load_team(ROOT / "recipes/code_pair.yaml")
    pool = RayRollouts(RayOptions(workers=1), model="tiny", dtype="float32")
    try:
        play = pool.bind(team, {})
        # as the GCS reports the node once its health checks fail (the test's Ray lives on for the others)
        monkeypatch.setattr(ray_local, "nodes", lambda: [{"NodeID": pool.node, "Alive": False, "NodeManagerAddress": "192.0.2.9",
                                                          "DeathReasonMessage": "health check failed due to missing too many heartbeats"}])
        ray_local.kill(pool.actors[0])
        with pytest.raises(WorkersLost, match=r"^the rollout workers' Ray node 192.0.2.9 died \(health check failed "
                                              r"due to missing too many heartbeats\); .* --resume$"):
            asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "run", play=play, episodes=2, seed=3,
                                                      progress=False)))
        assert pool.restarts == 0  # no replacement waiting for a node
    finally:
        pool.close()


def test_a_node_of_others_dead_in_this_ray_does_not_stop_the_run(ray_local, tmp_path, monkeypatch):
    """Ray lists dead nodes for a while, and a Ray the run joined has others' nodes: only this
    machine's node dead stops the run, and the GCS is asked off the event loop."""
    from orchestrator.rollout import RunOptions, run_team
    from orchestrator.workers import RayOptions, RayRollouts

    team = load_team(ROOT / "recipes/code_pair.yaml")
    pool = RayRollouts(RayOptions(workers=1), model="tiny", dtype="float32")
    nodes, asked_on = ray_local.nodes(), []

    def listed():
        asked_on.append(threading.current_thread())
        return nodes + [{"NodeID": "f" * 56, "Alive": False, "NodeManagerAddress": "192.0.2.9", "DeathReasonMessage": ""}]

    try:
        play = pool.bind(team, {})
        monkeypatch.setattr(ray_local, "nodes", listed)
        ray_local.kill(pool.actors[0])
        result = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "run", play=play, episodes=2, seed=3,
                                                           progress=False)))
        assert len(result.episodes) == 2 and pool.restarts == 1
        assert asked_on and threading.main_thread() not in asked_on
    finally:
        pool.close()


def test_workers_on_a_cluster_stop_the_run_only_when_no_node_is_alive(ray_local, monkeypatch):
    """A cluster's autoscaler may replace a dead node among live ones, so a replacement worker waits
    for a place there; with no node alive the run stops. A mutant stopping at any dead node passed
    every test."""
    from orchestrator.errors import WorkersLost
    from orchestrator.workers import RayOptions

    with one_worker(light_worker(), RayOptions(address="auto", workers=1)) as pool:
        dead = {"NodeID": "f" * 56, "Alive": False, "NodeManagerAddress": "192.0.2.9", "DeathReasonMessage": "preempted"}
        monkeypatch.setattr(ray_local, "nodes", lambda: [dead, {**dead, "NodeID": "e" * 56, "Alive": True}])
        pool._check_nodes()
        monkeypatch.setattr(ray_local, "nodes", lambda: [dead])
        with pytest.raises(WorkersLost, match=r"^the rollout workers' Ray node 192.0.2.9 died \(preempted\)"):
            pool._check_nodes()


def test_a_run_that_stops_stops_its_other_episodes(tmp_path):
    """Its other episodes went on playing after the run stopped (the workers closed under them),
    each failing and writing to the closed transcripts file."""
    from orchestrator.errors import WorkersLost
    from orchestrator.rollout import RunOptions, run_team

    team, finished = load_team(ROOT / "recipes/code_pair.yaml"), []

    async def play(record):
        if record.index == 0:
            raise WorkersLost("the node died")
        await asyncio.sleep(0.1)
        finished.append(record.index)
        return record

    async def main():
        with pytest.raises(WorkersLost):
            await run_team(team, {}, RunOptions(out_dir=tmp_path / "run", play=play, episodes=3, seed=0,
                                                progress=False))
        await asyncio.sleep(0.3)  # the run's clean-up

    asyncio.run(main())
    assert finished == []


def _worker_folders(pids: list[int]) -> list[Path]:
    return [f for pid in pids for f in Path(tempfile.gettempdir()).glob(f"rolecast-scratch-*-{pid}/worker-*")]


def test_a_worker_that_died_between_episodes_is_replaced_with_the_latest_weights(ray_local, tmp_path):
    """A worker killed while idle (the trainer stepping) fails the weights' sync before the next
    episode: it is replaced there, the new one loads the published version, and its folders go."""
    from orchestrator.rollout import RunOptions, run_team
    from orchestrator.workers import RayOptions, RayRollouts

    team = load_team(ROOT / "recipes/code_pair.yaml")
    options = dict(episodes=2, seed=3, progress=False)
    pool = RayRollouts(RayOptions(workers=1), model="tiny", dtype="float32")
    play = pool.bind(team, {})
    try:
        first = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "a", play=play, **options)))
        pids = [ray_local.get(pool.actors[0].pid.remote())]
        assert _worker_folders(pids)
        ray_local.kill(pool.actors[0])
        pool.publish("coder", peft_dir(tmp_path / "coder", lora_state(tiny_engine().model, seed=1)), 7)
        after = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "b", play=play, **options)))
        pids.append(ray_local.get(pool.actors[0].pid.remote()))
        ray_local.kill(pool.actors[0])  # killed with the weights loaded, none published since: its successor loads them
        again = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "c", play=play, **options)))
        pids.append(ray_local.get(pool.actors[0].pid.remote()))
    finally:
        pool.close()
    assert [r.status for r in first.episodes + after.episodes + again.episodes] == ["ok"] * 6 and pool.restarts == 2
    for played in (after, again):
        assert {a.adapter_version for r in played.episodes for t in r.turns if t.role == "coder" for a in t.attempts} == {7}
    assert not _worker_folders(pids)  # the dead one's went when its successor started; the live one's at close


def test_a_worker_holds_only_the_adapters_and_versions_the_driver_publishes(ray_local, tmp_path):
    """A worker loads a version once, keeps only the held version's files, and unloads an adapter
    the driver forgot (RayRollouts.forget: a self-play snapshot let go). Mutants reloading every
    adapter before each episode, or keeping a forgotten adapter (in the engine, and its files) or
    each old version's files for the rest of the run, passed every test."""
    from orchestrator.workers import RolloutWorker

    worker = RolloutWorker("tiny", "float32", 0, "hf", "cpu", 0)

    def published(seed: int):  # as RayRollouts.publish sends a PEFT dir
        folder = peft_dir(tmp_path / str(seed), lora_state(worker.engine.model, seed=seed))
        return ray_local.put({p.name: p.read_bytes() for p in folder.iterdir()})

    snap = published(1)
    try:
        worker.sync({"snap": (1, snap), "coder": (1, published(2))})
        worker.sync({"snap": (1, snap), "coder": (2, published(3))})
        assert worker.engine.versions == {"snap": 1, "coder": 2}  # snap not loaded again
        assert sorted(p.relative_to(worker.folder).as_posix() for p in worker.folder.glob("*/*")) == ["coder/2", "snap/1"]
        worker.sync({"coder": (2, published(3))})
        assert worker.engine.versions == {"coder": 2} and worker.loaded == {"coder": 2}
        assert [p.name for p in worker.folder.iterdir()] == ["coder"] and {k[0] for k in worker.driver_version} == {"coder"}
    finally:
        worker.remove_folder()


def test_an_episode_that_kills_its_worker_fails_alone(ray_local, tmp_path):
    """Every episode on a worker dies with it; replayed, the ones beside an episode that kills its
    worker every time would die with it again and again. After two deaths an episode plays with
    the worker to itself, so the culprit fails and its neighbours finish."""
    from orchestrator.rollout import RunOptions, run_team
    from orchestrator.workers import RolloutWorker

    class Poisoned(RolloutWorker):
        async def play(self, key, record):
            if record.index == 0:
                await asyncio.sleep(0.5)  # its neighbours are in flight when it dies
                os._exit(1)
            return await super().play(key, record)

    team = load_team(ROOT / "recipes/code_pair.yaml")
    with one_worker(Poisoned) as pool:
        result = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "run", play=pool.bind(team, {}),
                                                           episodes=3, seed=3, progress=False)))
    assert [r.status for r in result.episodes] == ["error", "ok", "ok"]
    assert "its rollout worker died 4 times, the last 2 with no other episode on it" in result.episodes[0].error
    assert pool.restarts == 4  # one new worker a death: the culprit's four


def test_an_episode_timed_out_while_its_worker_is_replaced_leaves_no_half_bound_worker(ray_local, tmp_path):
    """The episode's timeout can cancel a replacement before every team is bound to the new worker
    (a run binds two: training's and the evaluations'); the next episode then finds a worker that
    knows its team, not one that fails every episode of the other."""
    import time

    from orchestrator.rollout import RunOptions, run_team
    from orchestrator.workers import RolloutWorker

    started = tmp_path / "started"

    class SlowToReplace(RolloutWorker):
        def __init__(self, *args):
            if started.exists():  # a replacement: slower to load than the episode's timeout
                time.sleep(3)
            started.touch()
            super().__init__(*args)

    team = load_team(ROOT / "recipes/code_pair.yaml")
    with one_worker(SlowToReplace) as pool:
        first, second = pool.bind(team, {}), pool.bind(team, {})
        ray_local.kill(pool.actors[0])
        options = dict(episodes=1, seed=3, progress=False)
        timed_out = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "a", play=first, episode_timeout_s=1.5,
                                                              **options)))
        after = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "b", play=second, **options)))
    assert [r.status for r in timed_out.episodes] == ["timeout"]
    assert [(r.status, r.error) for r in after.episodes] == [("ok", None)]


def test_an_episode_that_raises_on_a_worker_keeps_its_turns_and_its_error(ray_local, tmp_path):
    """As without Ray: the turns taken before the fault, and the fault in one line (not Ray's
    traceback of the worker)."""
    from orchestrator.policies.binding import Binding
    from orchestrator.rollout import RunOptions, run_team
    from orchestrator.workers import RayOptions, RayRollouts

    def breaks(request):
        if request.turn:
            raise RuntimeError(f"broke on turn {request.turn}")
        return json.dumps({"guess": 8})

    team = load_team(ROOT / "recipes/guess_number.yaml")  # episode 0's secret is 1: the guess of 8 does not end it
    pool = RayRollouts(RayOptions(workers=1), model="tiny", dtype="float32")
    try:
        play = pool.bind(team, {"guesser": Binding("python", "here:breaks", fn=breaks)})
        result = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "run", play=play, episodes=1, seed=3,
                                                           progress=False)))
    finally:
        pool.close()
    (episode,) = result.episodes
    assert (episode.status, episode.error, len(episode.turns)) == ("error", "RuntimeError: broke on turn 1", 1)


def test_a_cluster_address_nothing_answers_at_fails_at_once():
    """Ray retries a dead address for about a quarter of an hour; the pool checks it first."""
    from orchestrator.errors import RolecastError
    from orchestrator.workers import check_reachable

    with socket.socket() as held:  # bound, not listening: refused, and no other process can take the port
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
            with pytest.raises(RolecastError, match=rf"--ray {address}: no Ray cluster answers there .*--ray local"):
                check_reachable(address, timeout_s=2)
    with socket.create_server(("127.0.0.1", 0)) as server:
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=0.5)  # says nothing first: Ray's to try
    # a connection nothing takes up (a firewall that drops it, here a full accept queue): no cluster either
    with socket.create_server(("127.0.0.1", 0), backlog=0) as server, contextlib.ExitStack() as queued:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        for _ in range(8):  # the queue holds one or two
            try:
                queued.enter_context(socket.create_connection(server.getsockname(), timeout=0.5))
            except TimeoutError:
                break
        with pytest.raises(RolecastError, match=rf"--ray {address}: no Ray cluster answers there \(timed out\)"):
            check_reachable(address, timeout_s=0.5)
    check_reachable("auto")  # Ray finds the cluster itself
    # a web server (the dashboard's port for the cluster's): it answers Ray's opening in text
    with socket.create_server(("127.0.0.1", 0)) as server:
        def answer():
            conn, _ = server.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer)
        thread.start()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(RolecastError, match=rf"--ray {address}: a web server answers there, not a Ray cluster"):
            check_reachable(address)
        thread.join()


def test_a_cluster_address_in_ipv6_brackets_is_checked_at_its_host():
    """Ray takes "[::1]:6379"; the check looked the bracketed text up as a host name and refused a
    cluster that answers there: "no Ray cluster answers there (Name or service not known)"."""
    from orchestrator.errors import RolecastError
    from orchestrator.workers import check_reachable

    try:
        server = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with server:
        for address in (f"[::1]:{server.getsockname()[1]}", f"ray://[::1]:{server.getsockname()[1]}"):
            check_reachable(address, timeout_s=0.5)  # says nothing first: Ray's to try
    with socket.socket(socket.AF_INET6) as held:  # bound, not listening: refused
        held.bind(("::1", 0))
        with pytest.raises(RolecastError, match=r"no Ray cluster answers there \(Connection refused\)"):
            check_reachable(f"[::1]:{held.getsockname()[1]}", timeout_s=2)


def test_an_address_ray_cannot_parse_is_one_line(ray_local, monkeypatch):
    from orchestrator.errors import RolecastError
    from orchestrator.workers import RayOptions, RayRollouts

    monkeypatch.setattr(ray_local, "is_initialized", lambda: False)  # as in a run that starts or joins Ray itself
    for address, said in (("nonsense", "Invalid address format"), (":6379", "Malformed host"),
                          ("tcp://head", "Module: tcp does not exist")):
        with pytest.raises(RolecastError, match=rf"--ray {address}: {said}"):
            RayRollouts(RayOptions(address=address, workers=1), model="tiny")


def test_a_worker_that_cannot_start_is_one_line(ray_local):
    from orchestrator.errors import RolecastError
    from orchestrator.workers import RayOptions, RayRollouts

    pool = RayRollouts(RayOptions(workers=1), model="no-such-model", dtype="float32")
    try:
        with pytest.raises(RolecastError, match=r"a rollout worker could not start: --model no-such-model: unknown model"):
            pool.bind(load_team(ROOT / "recipes/code_pair.yaml"), {})
    finally:
        pool.close()


def test_bindings_a_worker_cannot_load_or_ray_cannot_send_are_one_line(ray_local):
    """The driver checks a binding where it runs; a worker imports it again (another node, another
    sys.path), and Ray must pickle it to get it there."""
    import threading

    from orchestrator.errors import RolecastError
    from orchestrator.policies.binding import Binding
    from orchestrator.workers import RayOptions, RayRollouts

    team, lock = load_team(ROOT / "recipes/code_pair.yaml"), threading.Lock()
    pool = RayRollouts(RayOptions(workers=1), model="tiny", dtype="float32")
    try:
        with pytest.raises(RolecastError, match=r"a rollout worker cannot bind code_pair's roles: cannot import "
                                                r"'no_such_module' for python policy"):
            pool.bind(team, {"tester": Binding("python", "no_such_module:fn")})
        with pytest.raises(RolecastError, match=r"code_pair's roles cannot be sent to the rollout workers: "
                                                r"cannot pickle '_thread.lock' object"):
            pool.bind(team, {"tester": Binding("python", "here:fn", fn=lambda request: lock and "{}")})
    finally:
        pool.close()


def test_the_run_keeps_its_sigterm_handler_when_it_starts_ray(ray_local, monkeypatch):
    """ray.init installs a SIGTERM handler that exits at once (code 15), skipping the run's
    clean-up that the CLI's handler lets run: the pool puts the run's back."""
    import signal

    from orchestrator.workers import RayOptions, RayRollouts

    def ours(signum, frame):
        raise KeyboardInterrupt

    def rays_init(**kwargs):  # as ray.init does, on the Ray the fixture started
        signal.signal(signal.SIGTERM, lambda signum, frame: None)

    before = signal.signal(signal.SIGTERM, ours)
    asked = iter([False])  # the pool asks first; Ray's own calls after its init see it started
    monkeypatch.setattr(ray_local, "is_initialized", lambda: next(asked, True))
    monkeypatch.setattr(ray_local, "init", rays_init)
    monkeypatch.setattr(ray_local, "shutdown", lambda: None)  # the fixture's Ray stays up
    try:
        pool = RayRollouts(RayOptions(workers=1), model="tiny", dtype="float32")
        assert signal.getsignal(signal.SIGTERM) is ours
        pool.close()
    finally:
        signal.signal(signal.SIGTERM, before)


def test_ray_local_starts_ray_here_whatever_cluster_the_environment_names(ray_local, monkeypatch):
    """Given no address, ray.init joins the cluster RAY_ADDRESS names (set in a Ray cluster's pods)
    or one `ray start` left on this node, and then refuses num_cpus: --ray local starts its own."""
    from ray._private.services import canonicalize_bootstrap_address

    from orchestrator.workers import RayOptions, RayRollouts

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    joins = []
    asked = iter([False])  # the pool asks first; Ray's own calls after its init see it started
    monkeypatch.setattr(ray_local, "is_initialized", lambda: next(asked, True))
    monkeypatch.setattr(ray_local, "init", lambda **kwargs: joins.append(canonicalize_bootstrap_address(kwargs.get("address"))))
    monkeypatch.setattr(ray_local, "shutdown", lambda: None)  # the fixture's Ray stays up
    RayRollouts(RayOptions(workers=1), model="tiny", dtype="float32").close()
    assert joins == [None]  # None: Ray starts a local instance


def test_a_pool_that_starts_ray_sizes_it_and_stops_it_with_its_workers(ray_local, monkeypatch):
    """--ray local starts Ray with a CPU for each worker (at least the machine's), its workers at
    normal priority; closing the pool (or refusing its workers) stops the workers and that Ray."""
    from orchestrator.errors import RolecastError
    from orchestrator.workers import RayOptions, RayRollouts

    inits, shutdowns = [], []
    monkeypatch.delenv("RAY_worker_niceness")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    monkeypatch.setattr(ray_local, "init", lambda **kwargs: inits.append(kwargs))
    monkeypatch.setattr(ray_local, "shutdown", lambda: shutdowns.append(1))  # the fixture's Ray stays up
    monkeypatch.setattr(ray_local, "is_initialized", lambda: bool(inits))  # the pool's init starts it
    with pytest.raises(RolecastError, match=r"--rollout-workers 3: .* this Ray has 2: use --rollout-workers 1"):
        RayRollouts(RayOptions(workers=3, cpus_per_worker=1.5), model="tiny", dtype="float32")
    assert (inits[0]["address"], inits[0]["num_cpus"], shutdowns) == ("local", 5, [1])
    assert os.environ["RAY_worker_niceness"] == "0"
    inits.clear()
    pool = RayRollouts(RayOptions(workers=1), model="tiny", dtype="float32")
    actors = list(pool.actors)
    pool.close()
    assert shutdowns == [1, 1]
    with pytest.raises(ray_local.exceptions.RayActorError):  # killed, not left holding its CPU
        ray_local.get(actors[0].pid.remote(), timeout=30)
    pool.close()  # a second close (a failed train closes twice) stops no Ray started since
    assert shutdowns == [1, 1]


def test_an_episode_that_times_out_is_stopped_on_its_worker(ray_local, tmp_path):
    """The episode's timeout cancels it on the worker too: else it plays on there, unseen, taking
    the engine's batches from the episodes after it."""
    import time

    from orchestrator.rollout import RunOptions, run_team
    from orchestrator.workers import RolloutWorker

    finished = tmp_path / "finished"

    class Slow(RolloutWorker):
        async def play(self, key, record):
            await asyncio.sleep(3)
            finished.touch()
            return await super().play(key, record)

    team = load_team(ROOT / "recipes/code_pair.yaml")
    with one_worker(Slow) as pool:
        result = asyncio.run(run_team(team, {}, RunOptions(out_dir=tmp_path / "run", play=pool.bind(team, {}),
                                                           episodes=1, seed=3, episode_timeout_s=1, progress=False)))
        time.sleep(4)
    assert [r.status for r in result.episodes] == ["timeout"]
    assert not finished.exists()


def test_vllm_workers_need_a_gpu_before_ray_starts(tmp_path):
    import rolecast

    with pytest.raises(rolecast.RolecastError, match="--ray with --engine vllm needs --device cuda"):
        rolecast.run(ROOT / "recipes/code_pair.yaml", episodes=1, engine="vllm", device="cpu", ray="local",
                     out=tmp_path / "run", progress=False)


def test_workers_are_sized_for_the_adapters_they_are_given(tmp_path, monkeypatch):
    """vLLM preallocates its adapter slots: workers started for rank 64 refused a rank-128
    --adapter (or --opponent checkpoint) that the same command loads without --ray."""
    from orchestrator import workers
    from orchestrator.launch import Compute, adapter_dirs, policies_and_workers

    started = {}

    class Pool:
        workers = 1

        def __init__(self, options, **kwargs):
            started.update(kwargs)

        def publish(self, name, path, version):
            pass

    monkeypatch.setattr(workers, "RayRollouts", Pool)
    adapter = tmp_path / "pro"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 128}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    policies_and_workers(Compute(engine="vllm", device="cuda", ray="local"), load_team(ROOT / "recipes/debate.yaml"),
                         {}, "tiny", 0, adapter_dirs({"pro": adapter}))
    assert started["lora_rank"] == 128


def test_gpu_workers_load_on_the_one_gpu_ray_shows_each(monkeypatch):
    """Ray shows a GPU worker its GPU alone, as cuda:0 (CUDA_VISIBLE_DEVICES): the driver's
    --device cuda:1 named no device there, and every worker failed to start."""
    from orchestrator import workers
    from orchestrator.launch import Compute

    started = {}

    class Pool:
        def __init__(self, options, **kwargs):
            started.update(kwargs, gpus=options.gpus_per_worker, workers=options.workers)

    monkeypatch.setattr(workers, "RayRollouts", Pool)
    Compute(device="cuda:1", ray="local").workers("tiny", 0)
    assert (started["device"], started["gpus"], started["workers"]) == ("cuda", 1.0, 2)  # 2: --rollout-workers' default


def test_play_on_workers_keeps_each_ones_concurrency_and_closes_each_engine_once_and_the_workers(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from orchestrator import rollout
    from orchestrator.launch import play

    seen, closed = {}, []

    async def run_team(team, policies, options):
        seen.update(play=options.play, concurrency=options.concurrency)
        raise RuntimeError("stop")

    class Engine:
        async def aclose(self):
            closed.append("engine")

    class Workers:
        workers = 3

        def bind(self, team, overrides):
            return "bound"

        def close(self):
            closed.append("workers")

    engine = Engine()  # shared by two roles, as one model serves them
    policies = {"a": SimpleNamespace(engine=engine), "b": SimpleNamespace(engine=engine), "c": object()}
    monkeypatch.setattr(rollout, "run_team", run_team)
    with pytest.raises(RuntimeError, match="stop"):  # clean-up on failure too
        asyncio.run(play("team", policies, rollout.RunOptions(episodes=1, seed=0, out_dir=tmp_path, concurrency=4),
                         Workers()))
    assert seen == {"play": "bound", "concurrency": 12} and closed == ["engine", "workers"]


def test_a_run_that_fails_after_the_workers_start_closes_them(ray_local, tmp_path, monkeypatch):
    import rolecast
    from orchestrator import workers

    closed = []
    monkeypatch.setattr(workers.RayRollouts, "close", lambda self: closed.append(self))
    monkeypatch.setattr("orchestrator.rollout.build_policies", lambda *a: (_ for _ in ()).throw(RuntimeError("no policies")))
    with pytest.raises(RuntimeError, match="no policies"):
        rolecast.run(ROOT / "recipes/code_pair.yaml", episodes=1, model="tiny", ray="local", out=tmp_path / "run",
                     progress=False)
    assert len(closed) == 1


def test_a_pool_of_no_workers_is_refused_before_ray_starts():
    """Compute refuses it for the commands and the API; the pool itself (its own API) had it
    untested: a mutant letting 0 through failed each episode on ``index % 0``."""
    pytest.importorskip("ray")
    from orchestrator.errors import RolecastError
    from orchestrator.workers import RayOptions, RayRollouts

    for workers in (0, -1):
        with pytest.raises(RolecastError, match=rf"^--rollout-workers {workers}: needs at least 1$"):
            RayRollouts(RayOptions(workers=workers), model="tiny")


def test_workers_that_this_ray_cannot_place_are_an_error_not_a_hang(ray_local):
    """Each GPU worker asks Ray for a GPU (and each worker for a CPU); on this machine's Ray (no GPU
    here, 2 CPUs) they would wait for ever. A cluster's address may autoscale, so there the workers
    are started and left to wait."""
    from orchestrator.errors import RolecastError
    from orchestrator.workers import RayOptions, RayRollouts

    class Pool(RayRollouts):
        worker = light_worker()

    with pytest.raises(RolecastError, match=r"--rollout-workers 2 on a GPU: .* this Ray has 0: use --device cpu"):
        RayRollouts(RayOptions(workers=2, gpus_per_worker=1.0), model="tiny", dtype="float32")
    assert ray_local.is_initialized()  # the test's Ray, not started by the pool: left running
    pool = Pool(RayOptions(address="auto", workers=1, gpus_per_worker=1.0), model="tiny", dtype="float32")
    assert pool.workers == 1
    assert ray_local.wait([pool.actors[0].pid.remote()], timeout=5)[0] == []  # waiting for a GPU, not started without one
    pool.close()
    # CPUs alike: the pool starts its own Ray with a CPU per worker, but one it joins may have fewer
    with pytest.raises(RolecastError, match=r"--rollout-workers 3: each worker takes 1 CPU of its own, and this Ray "
                                            r"has 2: use --rollout-workers 2 or fewer$"):
        RayRollouts(RayOptions(workers=3), model="tiny", dtype="float32")


@pytest.mark.parametrize("command", ["run", "eval"])
def test_run_and_eval_play_on_workers_what_they_play_here(ray_local, cli, tmp_path, command):
    flags = ["--model", "tiny", "--dtype", "float32", "--episodes", "4", "--no-progress", "--json"]
    recipe = ROOT / "recipes/code_pair.yaml"
    for name, extra in (("here", []), ("ray", ["--ray", "--rollout-workers", "2"])):
        code, out, err = cli(command, recipe, *flags, "--out", tmp_path / name, *extra)
        assert code == 0, err
    here, there = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("here", "ray"))
    assert there["status"] == {"ok": 4} and there["generated_tokens"] == here["generated_tokens"]
    episodes = {n: sorted(map(json.loads, (tmp_path / n / "transcripts.jsonl").read_text().splitlines()),
                          key=lambda e: e["index"]) for n in ("here", "ray")}
    assert [[t["content"] for t in e["turns"]] for e in episodes["ray"]] == \
        [[t["content"] for t in e["turns"]] for e in episodes["here"]]


def played_in_turns(scene) -> list[str]:
    """The order in which episodes take (+) and give back (-) their turns of one ``_Sharing``, as
    ``scene(play)`` starts them: ``play(name, alone, hold)`` holds its turn ``hold`` seconds."""
    from orchestrator.workers import _Sharing

    async def main():
        sharing, order = _Sharing(), []

        async def play(name, alone, hold=0.0):
            async with sharing.turn(alone):
                order.append(f"{name}+")
                await asyncio.sleep(hold)
                order.append(f"{name}-")

        await asyncio.wait_for(scene(play), timeout=10)  # a waiter left unwoken: a hang, here a failure
        return order

    return asyncio.run(main())


def test_an_episode_waiting_to_play_alone_holds_back_newcomers():
    # a stream of shared episodes would otherwise keep an episode to be replayed alone waiting for ever
    async def scene(play):
        first = asyncio.ensure_future(play("a", False, 0.05))
        await asyncio.sleep(0.01)
        lone = asyncio.ensure_future(play("alone", True))
        await asyncio.sleep(0.01)
        await asyncio.gather(first, lone, play("b", False))

    assert played_in_turns(scene) == ["a+", "a-", "alone+", "alone-", "b+", "b-"]


def test_an_episode_alone_plays_with_no_other_and_those_it_held_back_then_play_together():
    async def scene(play):
        async def after(delay, name, alone, hold):
            await asyncio.sleep(delay)
            await play(name, alone, hold)

        # waits for both shared ones (not the first to finish); a second alone one for the first;
        # the shared ones held back all start when it is done
        await asyncio.gather(play("a", False, 0.05), play("b", False, 0.1), after(0.01, "x", True, 0.05),
                             after(0.02, "y", True, 0.05), after(0.03, "c", False, 0.05), after(0.03, "d", False, 0.05))

    assert played_in_turns(scene) == ["a+", "b+", "a-", "b-", "x+", "x-", "y+", "y-", "c+", "d+", "c-", "d-"]
