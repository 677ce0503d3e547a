"""The interface around the containment: backend choice, faults, async, pool, CLI."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from sandboxes import (
    Limits,
    SandboxPool,
    SandboxSetupError,
    SandboxUnavailable,
    UnsafeBackendRefused,
    arun,
    run,
    select_backend,
)
from orchestrator.cli.sandbox import register as register_cli
from sandboxes import cgroup, confine, pool as pool_module, process, runner


def test_auto_picks_an_isolating_backend(workdir):
    r = run(["true"], workdir)
    assert r.ok and r.backend in ("bwrap", "unshare")
    assert r.backend == select_backend().name == ("bwrap" if runner.BACKENDS["bwrap"].available() is None else "unshare")
    assert r.backend in runner.available_backends() and "none" not in runner.available_backends()  # usable, never unsafe


def test_none_backend_is_refused_without_the_unsafe_flag(workdir):
    with pytest.raises(UnsafeBackendRefused):
        run(["true"], workdir, backend="none")
    r = run(["sh", "-c", "echo $FOO $HOME; pwd"], workdir, backend="none", allow_unsafe=True,
            env={"FOO": "bar", "HOME": "/elsewhere"})  # env adds to the defaults, and overrides them
    assert r.stdout.split() == ["bar", "/elsewhere", str(workdir)] and r.backend == "none"


def test_a_run_ends_soon_after_its_command_though_a_straggler_holds_its_output(workdir):
    """Backend none has no PID namespace to end with the command: a background child keeping
    stdout open is waited for only a moment (then killed with the run), not to the wall time."""
    r = run("sleep 30 & echo done", workdir, Limits(wall_time_s=10), backend="none", allow_unsafe=True)
    assert r.ok and r.stdout == "done\n" and r.duration_s < 5


def test_the_drain_grace_is_only_for_pipes_held_open(workdir, monkeypatch):
    """A command that closes its pipes as it exits ends its run then, not a grace later; one whose
    straggler holds them to the deadline ended in time itself, so it did not time out."""
    monkeypatch.setattr(process, "_DRAIN_GRACE_S", 30)
    quick = run(["true"], workdir, Limits(wall_time_s=60), backend="none", allow_unsafe=True)
    held = run("sleep 30 & echo done", workdir, Limits(wall_time_s=1), backend="none", allow_unsafe=True)
    assert quick.ok and quick.duration_s < 10
    assert held.ok and not held.timed_out and held.stdout == "done\n"


def test_without_a_memory_cgroup_a_straggler_dies_with_its_run(workdir, marker, processes_with, monkeypatch):
    """Backend none has no PID namespace, and without a memory cgroup to empty, killing the run's
    process group is all that ends a background child."""
    monkeypatch.setattr(cgroup, "_own_group", lambda: None)
    r = run(f"{sys.executable} -c 'import time; time.sleep(30)' {marker} &", workdir, Limits(wall_time_s=10),
            backend="none", allow_unsafe=True)
    assert r.ok, r.stderr
    deadline = time.monotonic() + 5  # SIGKILLed, a process may still be on its way out
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


@pytest.mark.parametrize("backend", ["bwrap", "unshare", "none"])
def test_a_backend_missing_a_tool_of_the_chain_is_unavailable(backend, monkeypatch):
    """Without prlimit (or setpriv, env, chown) a backend was chosen, and a pool made, and every run
    then failed with "prlimit not found"."""
    from sandboxes import confine

    monkeypatch.setattr(confine, "tool", lambda name: None if name == "prlimit" else f"/usr/bin/{name}")
    monkeypatch.setattr("sandboxes.bwrap.tool", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr("sandboxes.unshare.tool", lambda name: f"/usr/bin/{name}")
    with pytest.raises(SandboxUnavailable, match="unavailable: missing prlimit"):
        select_backend(backend, allow_unsafe=True)
    with pytest.raises(SandboxUnavailable, match="missing prlimit"):
        SandboxPool(backend=backend, allow_unsafe=True)


def test_faults_raise_clear_errors(tmp_path, workdir):
    with pytest.raises(SandboxUnavailable, match="unknown backend"):
        run(["true"], workdir, backend="docker")
    with pytest.raises(SandboxSetupError, match="not a directory"):
        run(["true"], tmp_path / "missing")
    with pytest.raises(SandboxSetupError, match="empty command"):
        run([], workdir)
    with pytest.raises(SandboxSetupError, match="does not exist"):  # was the command's exit 1 or 32
        run(["true"], workdir, readable=[tmp_path / "missing"])
    with pytest.raises(ValueError):
        Limits(wall_time_s=0)
    for endless in (float("nan"), float("inf")):  # inf crashed the CPU rlimit's ceil at each run
        with pytest.raises(ValueError, match="finite"):
            Limits(wall_time_s=endless)
    with pytest.raises(ValueError, match="memory_mb must be an int"):  # was an OSError from the cgroup
        Limits(memory_mb=256.5)


@pytest.fixture
def var_tmp_seen(monkeypatch):
    """/var/tmp as one of the system folders the sandbox sees of the host (it sees none of it by default)."""
    monkeypatch.setattr(runner, "SYSTEM", (*runner.SYSTEM, Path("/var/tmp")))


def test_unreachable_workdir_is_a_setup_error(backend, var_tmp_seen):
    hidden = Path("/var/tmp") / f"rolecast-closed-{os.getpid()}"
    (hidden / "work").mkdir(parents=True)
    hidden.chmod(0o700)
    try:
        with pytest.raises(SandboxSetupError, match="not searchable"):
            run(["true"], hidden / "work", backend=backend)
        hidden.chmod(0o711)  # as new_temporary_dir makes them: others pass through, not list
        assert run(["true"], hidden / "work", backend=backend).ok
    finally:
        (hidden / "work").rmdir()
        hidden.rmdir()


def test_a_workdir_in_a_closed_folder_the_sandbox_does_not_see_is_reached(backend):
    """The sandbox makes its own path to a workdir outside the host folders it sees."""
    closed = Path(tempfile.mkdtemp(dir="/var/tmp"))  # 0700
    try:
        (closed / "work").mkdir()
        r = run("echo made > out", closed / "work", backend=backend)
        assert r.ok, r.stderr
        assert (closed / "work" / "out").read_text() == "made\n"
    finally:
        subprocess.run(["rm", "-rf", "--", str(closed)], check=True)


@pytest.mark.parametrize("wd, holds", [("/", "/tmp"), ("/tmp", "/tmp"), ("/usr", "/usr"), ("/root", "/root"), ("/run", "/run")])
def test_a_workdir_holding_the_private_mounts_is_refused(backend, wd, holds, monkeypatch):
    """`rolecast sandbox run` in a container's cwd / lent the whole host to the sandbox's uid
    (chown -R, chmod 0700 /) and bound it writable; /tmp lent every other run's files, /usr the system,
    /root its owner's, /run the daemons' sockets."""

    def lend(root, *args, **kw):
        raise AssertionError(f"{root} was lent")  # never let the old code chown the host

    monkeypatch.setattr(runner, "chown_tree", lend)
    with pytest.raises(SandboxSetupError, match=f"contains {holds}"):
        run(["true"], wd, backend=backend)


def test_exit_code_signal_and_ownership_round_trip(sandbox, workdir):
    (workdir / "given").write_text("in")
    r = sandbox("cat given; echo out > made; kill -TERM $$")
    assert (r.exit_code, r.signal, r.stdout, r.out_of_memory) == (143, 15, "in", False)
    assert {p.stat().st_uid for p in workdir.iterdir()} == {0}  # handed back to the owner
    assert (workdir / "made").read_text() == "out\n"
    r = sandbox("exit 200")  # past 128, but 72 names no signal
    assert (r.exit_code, r.signal) == (200, None)


def test_a_signal_death_without_an_init_is_said_in_the_shell_convention(workdir):
    # backend none has no init to turn it into 128+N: Popen's negative return code is, SIGHUP's -1 too
    # (its default action set again: under nohup the command starts with SIGHUP ignored)
    hup = "import os, signal; signal.signal(signal.SIGHUP, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGHUP)"
    r = run([sys.executable, "-c", hup], workdir, backend="none", allow_unsafe=True)
    assert (r.exit_code, r.signal, r.ok) == (129, signal.SIGHUP, False)


def test_a_run_never_takes_a_uid_another_run_holds(workdir, monkeypatch):
    """Each run's own uid keeps its process limit its own and other runs out of its workdir."""
    monkeypatch.setattr(confine.random, "randrange", lambda n: 0)  # every lease tries slot 0 first
    with confine.lease_uid() as held:
        r = run("id -u", workdir)
    assert held == confine.UID_BASE and int(r.stdout) != held  # the next free slot (another test may hold one)


def test_a_lease_past_the_last_slot_wraps_to_the_first(monkeypatch):
    """Each uid a lease gives is in the documented range, however near its end the search starts."""
    monkeypatch.setattr(confine.random, "randrange", lambda n: n - 1)
    with contextlib.ExitStack() as stack:  # the second at least starts past the last slot
        held = [stack.enter_context(confine.lease_uid()) for _ in range(2)]
    assert all(confine.UID_BASE <= uid < confine.UID_BASE + confine.UID_SLOTS for uid in held), held


def test_a_command_that_closes_its_pipes_runs_to_its_end(workdir):
    """With both pipes closed there is nothing to read, but the command still runs: it is waited
    for, not killed as if it had ended. (Backend none: an isolating one's init holds the pipes.)"""
    r = run("exec >&- 2>&-; sleep 0.5; echo x > late; exit 3", workdir, Limits(wall_time_s=10),
            backend="none", allow_unsafe=True)
    assert (r.exit_code, r.timed_out) == (3, False) and (workdir / "late").exists()


def test_invalid_utf8_in_the_output_is_replaced(sandbox):
    r = sandbox("printf 'a\\377b'; printf '\\376' >&2")
    assert (r.stdout, r.stderr) == ("a\ufffdb", "\ufffd")


def test_no_free_uid_is_said_in_one_line(tmp_path, monkeypatch):
    """Not the contextmanager's "generator didn't yield"."""
    monkeypatch.setattr(confine, "LOCK_DIR", tmp_path)  # runs of other tests hold no lock there
    monkeypatch.setattr(confine, "UID_SLOTS", 1)
    with confine.lease_uid():
        with pytest.raises(SandboxUnavailable, match="all 1 sandbox uids are in use"):
            with confine.lease_uid():
                pass


def test_the_workdir_is_closed_to_other_runs_while_lent(sandbox, workdir):
    """Lent, the workdir is 0700: another run's uid cannot look in while this one works there."""
    workdir.chmod(0o755)
    assert sandbox("stat -c %a .").stdout == "700\n"
    assert workdir.stat().st_mode & 0o777 == 0o755  # and its mode is given back


def test_a_deep_tree_is_handed_back(sandbox, workdir):
    """The hand-back walked with os.walk (recursive) and lstat'ed full paths: a child nesting
    past the recursion limit, or past PATH_MAX, crashed run() with the workdir still lent."""
    nest = "import os\nfor name in ['d'] * 1100 + ['x' * 250] * 20:\n    os.mkdir(name); os.chdir(name)\n"
    before = workdir.stat()
    try:
        assert sandbox([sys.executable, "-c", nest]).ok
        owners = subprocess.run(["find", str(workdir), "-printf", "%U\n"], capture_output=True, text=True).stdout
        assert set(owners.split()) == {str(before.st_uid)} and len(owners.split()) == 1121
        assert workdir.stat().st_mode == before.st_mode
    finally:  # pytest's own clean-up of tmp_path recurses too
        subprocess.run(["rm", "-rf", "--", str(workdir / "d")], check=True)


def test_shared_memory_is_private_and_writable(sandbox, marker):
    """bwrap left /dev/shm a root-owned 0755 dir: multiprocessing's locks (sem_open) failed there."""
    lock = "import multiprocessing, sys; multiprocessing.Lock(); open('/dev/shm/' + sys.argv[1], 'w')"
    r = sandbox([sys.executable, "-c", lock, marker])
    assert r.ok, r.stderr
    assert not Path("/dev/shm", marker).exists()
    r = sandbox("head -c 2097152 /dev/zero > /dev/shm/big; wc -c < /dev/shm/big")  # capped at 1 MiB
    assert int(r.stdout) <= 1 << 20 and "No space left" in r.stderr


def test_a_readable_file_is_readable(backend, workdir, tmp_path):
    """unshare mounted a readable= file onto a directory it had made: exit 32, a mount error."""
    (tmp_path / "given.txt").write_text("read me")
    r = run(["cat", str(tmp_path / "given.txt")], workdir, backend=backend, readable=[tmp_path / "given.txt"])
    assert (r.exit_code, r.stdout) == (0, "read me"), r.stderr


def test_a_hidden_folder_is_empty_and_a_file_to_hide_is_refused(backend, workdir, var_tmp_seen):
    """hide= skipped what was not a folder: a secret file named there stayed readable."""
    secret = Path(tempfile.mkdtemp(dir="/var/tmp"))  # the sandbox never sees the host's /tmp
    try:
        (secret / "key.env").write_text("KEY=hunter2\n")
        os.chmod(secret, 0o755)
        os.chmod(secret / "key.env", 0o644)
        r = run(f"cat {secret}/key.env; ls {secret}", workdir, backend=backend, hide=[secret])
        assert "hunter2" not in r.stdout and "key.env" not in r.stdout
        for path in (secret / "key.env", secret / "missing"):
            with pytest.raises(SandboxSetupError, match="is not a folder"):
                run(f"cat {secret}/key.env", workdir, backend=backend, hide=[path])
    finally:
        subprocess.run(["rm", "-rf", "--", str(secret)], check=True)


@pytest.fixture
def data_dir():
    """A host folder outside the system ones (so unseen by default): module.py, and tasks/key.env."""
    outer = Path(tempfile.mkdtemp(dir="/var/tmp"))
    (outer / "tasks").mkdir()
    (outer / "tasks" / "key.env").write_text("KEY=hunter2\n")
    (outer / "module.py").write_text("seen\n")
    subprocess.run(["chmod", "-R", "a+rX", str(outer)], check=True)
    yield outer
    subprocess.run(["rm", "-rf", "--", str(outer)], check=True)


def test_a_folder_hidden_inside_a_readable_one_stays_hidden(backend, workdir, data_dir):
    """hide= took effect only in the folders seen from the host: the tasks of a package installed
    in the running Python's venv (bound for the child to import from) were readable."""
    r = run(f"cat {data_dir}/module.py {data_dir}/tasks/key.env; ls {data_dir}/tasks", workdir, backend=backend,
            readable=[data_dir], hide=[data_dir / "tasks"])
    assert r.stdout == "seen\n" and "No such file" in r.stderr


def test_a_folder_hidden_inside_the_workdir_stays_hidden(backend, workdir):
    """hide= took effect only in the system and readable folders: one inside the workdir (the tests
    of the repo under test) was silently left readable."""
    (workdir / "tests").mkdir()
    (workdir / "tests" / "key.env").write_text("KEY=hunter2\n")
    r = run("cat tests/key.env; ls tests; echo x > tests/new", workdir, backend=backend, hide=[workdir / "tests"])
    assert "hunter2" not in r.stdout and "key.env" not in r.stdout and "Permission denied" in r.stderr, r.stdout
    assert os.listdir(workdir / "tests") == ["key.env"]


def test_a_readable_path_is_read_only(backend, workdir, data_dir):
    """A data folder lent 0777 (and its file 0666) is still not the sandbox's to write: a bind."""
    data_dir.chmod(0o777)
    (data_dir / "module.py").chmod(0o666)
    r = run(f"echo x > {data_dir}/new; echo pwned >> {data_dir}/module.py", workdir, backend=backend,
            readable=[data_dir])
    assert r.stderr.count("Read-only file system") == 2, r.stderr
    assert not (data_dir / "new").exists() and (data_dir / "module.py").read_text() == "seen\n"


def test_a_system_folder_open_to_all_is_read_only(backend, workdir, var_tmp_seen, marker):
    """/var/tmp (1777) as one of the system folders: what any user may write on the host is
    still read-only inside."""
    r = run(f"echo x > /var/tmp/{marker}", workdir, backend=backend)
    assert "Read-only file system" in r.stderr and not Path("/var/tmp", marker).exists()


async def test_pool_runs_take_readable_and_hide(workdir, data_dir):
    """SandboxPool.run, what environments call, had no readable= or hide=: an env whose tests read a
    data folder outside the system ones had no way to lend it."""
    command = f"cat {data_dir}/module.py {data_dir}/tasks/key.env"
    async with SandboxPool(max_concurrent=1) as pool:
        unseen = await pool.run(command, workdir)
        lent = await pool.run(command, workdir, readable=[data_dir], hide=[data_dir / "tasks"])
    assert unseen.stdout == "" and lent.stdout == "seen\n" and "key.env: No such file" in lent.stderr


async def test_pool_runs_take_their_own_limits_and_env(workdir):
    """code_pair gives each run its task's limits: the pool's defaults (a 60 s wall time) are only
    for runs given none."""
    async with SandboxPool(max_concurrent=1, limits=Limits(wall_time_s=60)) as pool:
        r = await pool.run("echo $FOO; sleep 30", workdir, Limits(wall_time_s=0.5), env={"FOO": "bar"})
    assert r.timed_out and r.stdout == "bar\n" and r.duration_s < 20


def test_python_of_the_tests_is_usable(sandbox):
    # third-party packages of the venv import inside; rolecast's own (editable) source need not be
    # visible there: a checkout under /tmp is hidden by the private /tmp
    r = sandbox([sys.executable, "-c", "import structlog, pytest; print('ok')"])
    assert r.stdout == "ok\n", r.stderr


async def test_arun_does_not_block_the_loop(workdir):
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.05)

    t = asyncio.create_task(ticker())
    r = await arun(["sleep", "0.5"], workdir)
    t.cancel()
    assert r.ok and ticks >= 5


async def test_a_cancelled_arun_returns_once_the_run_has_ended(workdir):
    """Its caller cleans up next: removing the workdir under a run still writing there left the
    run's later files behind."""
    task = asyncio.create_task(arun(["sh", "-c", "sleep 0.5; echo late > late.txt"], workdir))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (workdir / "late.txt").read_text() == "late\n"


async def test_an_arun_cancelled_twice_still_returns_once_the_run_has_ended(workdir):
    """run_team cancels its lanes a second time as it stops (a Ctrl-C): the second cancel ended the
    wait, and code_pair removed its workdir under the run."""
    task = asyncio.create_task(arun(["sh", "-c", "sleep 0.5; echo late > late.txt"], workdir))
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (workdir / "late.txt").read_text() == "late\n"


async def test_a_cancelled_pool_run_still_queued_is_dropped_and_a_running_one_awaited(workdir):
    """A Ctrl-C with the pool full had waited for each queued run to start and end, one wall time
    after another; the running one must still end before its caller cleans up."""
    async with SandboxPool(max_concurrent=1, limits=Limits(wall_time_s=5)) as pool:
        tasks = [asyncio.create_task(pool.run(f"sleep 0.5; echo {name} > {name}.txt", workdir))
                 for name in ("first", "second")]
        tasks.append(asyncio.create_task(pool.call(time.sleep, 0.5)))
        await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with pytest.raises(asyncio.CancelledError):
                await task
        assert (workdir / "first.txt").read_text() == "first\n" and not (workdir / "second.txt").exists()


async def test_a_cancelled_pool_call_returns_once_its_function_has_ended(tmp_path):
    """As a run: its caller's clean-up must not remove files under a call still writing there."""
    started = threading.Event()

    def late() -> None:
        started.set()
        time.sleep(0.4)
        (tmp_path / "late.txt").write_text("late\n")

    async with SandboxPool(max_concurrent=1) as pool:
        task = asyncio.create_task(pool.call(late))
        await asyncio.to_thread(started.wait, 30)  # running, not queued: a queued call is dropped
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (tmp_path / "late.txt").read_text() == "late\n"


async def test_a_closed_pool_drops_its_queued_calls(tmp_path):
    pool, started = SandboxPool(max_concurrent=1), threading.Event()
    running = asyncio.ensure_future(pool.call(lambda: started.set() or time.sleep(0.3)))
    queued = asyncio.ensure_future(pool.call((tmp_path / "queued.txt").write_text, "ran"))
    await asyncio.to_thread(started.wait, 30)  # the first runs and the second waits behind it
    pool.close()
    await running
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert not (tmp_path / "queued.txt").exists()


def test_a_temporary_dir_is_removed_on_exit(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pool_module.temporary_dir("rolecast-test-") as path:
        (path / "a").mkdir()
        (path / "a" / "b.txt").write_text("b")
    assert path.parent == pool_module.scratch_root() and not path.exists()


def test_the_shared_pool_has_the_size_asked():
    assert pool_module.shared_pool("auto", 3).max_concurrent == 3


async def test_pool_bounds_concurrency_and_isolates_episodes(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "state.txt").write_text("clean\n")
    async with SandboxPool(max_concurrent=2, limits=Limits(wall_time_s=5)) as pool:

        copies = []

        async def episode(i: int) -> tuple[str, float, float]:
            async with pool.episode(repo) as wd:
                copies.append(wd)
                start = time.monotonic()
                r = await pool.run(f"cat state.txt; echo dirty-{i} >> state.txt; sleep 0.4", wd)
                return r.stdout, start, time.monotonic()

        results = await asyncio.gather(*(episode(i) for i in range(4)))
    assert [out for out, _, _ in results] == ["clean\n"] * 4  # no episode saw another's write
    assert (repo / "state.txt").read_text() == "clean\n"
    assert [wd.parent.parent for wd in copies] == [pool_module.scratch_root()] * 4  # the process's scratch
    assert not any(wd.parent.exists() for wd in copies)  # copies removed
    # Four 0.4 s runs two at a time take at least two rounds.
    assert max(end for _, _, end in results) - min(start for _, start, _ in results) >= 0.8


async def test_an_episode_outside_tmp_runs_and_stays_private(tmp_path):
    """mkdtemp made the episode's folder 0700: outside /tmp (TMPDIR=/var/tmp) the sandbox uid could
    not pass through it, and every run in the episode's own copy was refused."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "state.txt").write_text("clean\n")
    scratch = Path(tempfile.mkdtemp(dir="/var/tmp"))  # the sandbox sees /var/tmp, not the host's /tmp
    scratch.chmod(0o755)
    try:
        async with SandboxPool(1, scratch_dir=scratch, limits=Limits(wall_time_s=5)) as pool:
            async with pool.episode(tmp_path / "repo") as wd:
                mine = await pool.run("cat state.txt", wd)
                with tempfile.TemporaryDirectory(dir="/var/tmp") as other:
                    os.chmod(other, 0o755)
                    peek = await pool.run(f"cat {wd}/state.txt; ls {wd.parent}", other)
    finally:
        subprocess.run(["rm", "-rf", "--", str(scratch)], check=True)
    assert mine.stdout == "clean\n"
    assert peek.exit_code != 0 and "clean" not in peek.stdout and "repo" not in peek.stdout


def test_the_scratch_of_a_killed_process_is_removed_by_the_next(tmp_path, monkeypatch):
    """A process SIGKILLed (the OOM killer, a Ray worker killed) left its code_pair workdirs, repo
    copies and worker adapter folders in $TMPDIR for good; a process that ends removes its own."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    make = "from sandboxes.pool import new_temporary_dir as new; print(new('rolecast-code-pair-'), flush=True)"
    victim = subprocess.run([sys.executable, "-c", f"{make}; import os; os.kill(os.getpid(), 9)"],
                            capture_output=True, text=True, env=env)
    left = Path(victim.stdout.strip())
    assert victim.returncode == -9 and left.is_dir() and left.parent.name.startswith("rolecast-scratch-")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine, other = pool_module.scratch_root(), tmp_path / "rolecast-scratch-of-another"
    other.mkdir()
    ended = subprocess.run([sys.executable, "-c", make], capture_output=True, text=True, env=env)
    assert ended.returncode == 0, ended.stderr
    assert not left.parent.exists() and not Path(ended.stdout.strip()).parent.exists()  # at its exit
    assert mine.is_dir() and other.is_dir()  # a live process's, and what is none of ours


def test_a_private_copy_is_0700_and_keeps_links_as_links(tmp_path):
    """Followed, a link in the repo copied the host file it names into the episode's copy, where
    the sandboxed run reads it; a copy open to others let other runs' uids into it between runs."""
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    (tmp_path / "repo").mkdir(mode=0o755)
    (tmp_path / "repo" / "leak.txt").symlink_to(secret)
    copy = pool_module.copy_private(tmp_path / "repo", tmp_path / "copy")
    assert (copy / "leak.txt").is_symlink() and os.readlink(copy / "leak.txt") == str(secret)
    assert copy.stat().st_mode & 0o777 == 0o700
    with pytest.raises(SandboxSetupError, match="is not a directory"):  # not a FileNotFoundError traceback
        pool_module.copy_private(tmp_path / "missing", tmp_path / "copy2")


def test_a_scratch_is_kept_while_its_process_may_live_and_made_again_once_removed(tmp_path, monkeypatch):
    """Only the scratch of a process of this pid namespace known gone is removed: another user's
    process (EPERM), another container's pid, a name that holds no pid are kept."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    namespace = os.stat("/proc/self/ns/pid").st_ino
    gone, pid = (int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                    capture_output=True, text=True).stdout) for _ in range(2))
    keep = [tmp_path / f"rolecast-scratch-{namespace + 1}-{gone}", tmp_path / f"rolecast-scratch-{namespace}-{gone}x"]
    for folder in keep:
        folder.mkdir()
    real_kill = os.kill

    def kill(target: int, sig: int) -> None:
        if target == pid:  # as root, no process is another user's
            raise PermissionError
        real_kill(target, sig)

    monkeypatch.setattr(os, "kill", kill)
    other_users = tmp_path / f"rolecast-scratch-{namespace}-{pid}"
    other_users.mkdir()
    mine = pool_module.scratch_root()
    assert all(folder.is_dir() for folder in [*keep, other_users])
    assert mine.stat().st_mode & 0o777 == 0o711  # a sandbox uid passes through to its workdir
    mine.rmdir()
    assert pool_module.scratch_root() == mine and mine.is_dir()  # removed under us: made again


def test_a_forked_child_leaves_its_parents_scratch(tmp_path):
    """The child inherits the atexit handler, not the folder: at its exit it removed the parent's."""
    code = ("import os, sys\nfrom sandboxes.pool import scratch_root\npath = scratch_root()\n"
            "if os.fork() == 0:\n    sys.exit(0)\nos.wait()\nprint(path.is_dir())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.stdout == "True\n", r.stderr


async def test_an_episode_deletes_a_deep_tree(tmp_path):
    """shutil.rmtree recursed: a command nesting ~1000 dirs made the episode raise RecursionError
    and left its copy behind."""
    (tmp_path / "repo").mkdir()
    nest = "import os\nfor _ in range(1100):\n    os.mkdir('d'); os.chdir('d')\n"
    async with SandboxPool(1, scratch_dir=tmp_path / "scratch") as pool:
        try:
            async with pool.episode(tmp_path / "repo") as wd:
                assert (await pool.run([sys.executable, "-c", nest], wd)).ok
        finally:  # pytest's own clean-up of tmp_path recurses too
            leftover = list((tmp_path / "scratch").iterdir())
            subprocess.run(["rm", "-rf", "--", str(tmp_path / "scratch")], check=True)
    assert leftover == []


async def test_an_episode_cancelled_while_copying_leaves_no_copy(tmp_path, monkeypatch):
    """The removal raced the copy's thread, still going after the cancel: the copy stayed behind."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.txt").write_text("a\n")
    started, ended = threading.Event(), threading.Event()
    copy = pool_module.copy_private

    def slow_copy(src, dest, ignore=None):
        started.set()
        time.sleep(0.3)
        try:
            return copy(src, dest, ignore)
        finally:
            ended.set()

    monkeypatch.setattr(pool_module, "copy_private", slow_copy)
    async with SandboxPool(1, scratch_dir=tmp_path / "scratch") as pool:

        async def episode() -> None:
            async with pool.episode(tmp_path / "repo"):
                await asyncio.sleep(10)

        task = asyncio.create_task(episode())
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await asyncio.to_thread(ended.wait, 5)
    assert list((tmp_path / "scratch").iterdir()) == []


def test_one_pool_serves_successive_event_loops(tmp_path):
    """`rolecast compare` runs each strategy under its own asyncio.run with the process's shared
    pool: a loop-bound lock in the pool failed every episode after the first strategy."""
    pool = SandboxPool(max_concurrent=1, limits=Limits(wall_time_s=5))

    async def two_at_once() -> list[str]:
        return [r.stdout for r in await asyncio.gather(*(pool.run("echo ok", tmp_path) for _ in range(2)))]

    try:
        assert asyncio.run(two_at_once()) == ["ok\n", "ok\n"]
        assert asyncio.run(two_at_once()) == ["ok\n", "ok\n"]
    finally:
        pool.close()


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rolecast")
    register_cli(parser.add_subparsers())
    return parser.parse_args(["sandbox", "run", *argv])


def test_cli_prints_output_and_returns_exit_code(workdir, capsys):
    args = _cli("--timeout", "2", "--workdir", str(workdir), "--", "sh", "-c", "echo hi; echo err >&2; exit 3")
    assert args.func(args) == 3
    out, err = capsys.readouterr()
    assert out.endswith("hi\n") and "err\n" in err and "exit=3" in err


def test_the_cli_says_its_summary_as_a_json_line_with_log_json(workdir, capsys):
    """``rolecast --log-json sandbox run``: its summary was console text among stderr's JSON lines."""
    from orchestrator import logs
    from orchestrator.cli import main

    try:
        assert main(["--log-json", "sandbox", "run", "--workdir", str(workdir), "--", "true"]) == 0
    finally:
        logs.configure()  # console lines again, for the tests that call a command's handler alone
    said = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert said[-1]["event"].startswith("[sandbox ") and "exit=0" in said[-1]["event"]


def test_cli_json_and_refusals(workdir, capsys):
    args = _cli("--json", "--timeout", "0.5", "--workdir", str(workdir), "--", "sleep", "5")
    assert args.func(args) == 137
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["timed_out"] and result["signal"] == 9
    args = _cli("--json", "--memory", "16", "--workdir", str(workdir), "--", "python3", "-c", "x = bytearray(10**8)")
    assert args.func(args) == 137 and json.loads(capsys.readouterr().out)["out_of_memory"]
    args = _cli("--backend", "none", "--workdir", str(workdir), "--", "true")
    assert args.func(args) == 2
    assert "allow_unsafe" in capsys.readouterr().err
    args = _cli("--timeout", "inf", "--workdir", str(workdir), "--", "true")  # was an OverflowError traceback
    assert args.func(args) == 2
    assert "wall_time_s must be positive and finite, got inf" in capsys.readouterr().err


def test_the_cli_refuses_a_missing_command(workdir, capsys):
    for argv in (("--workdir", str(workdir)), ("--workdir", str(workdir), "--")):
        args = _cli(*argv)
        assert args.func(args) == 2
        assert capsys.readouterr().err.strip() == "rolecast sandbox run: missing command after --"


def test_the_cli_lends_readable_paths_and_hides_folders(workdir, data_dir, capsys):
    args = _cli("--workdir", str(workdir), "--readable", str(data_dir), "--hide", str(data_dir / "tasks"),
                "--", "cat", str(data_dir / "module.py"), str(data_dir / "tasks" / "key.env"))
    assert args.func(args) == 1
    out, err = capsys.readouterr()
    assert out == "seen\n" and "key.env: No such file" in err


def test_the_cli_builds_in_a_removed_folder(tmp_path, monkeypatch, capsys):
    """--workdir's default was os.getcwd() when the parser was built, as every command builds it: in
    a folder since removed, `rolecast validate` and `rolecast --help` were a FileNotFoundError traceback."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    args = _cli("--", "true")
    assert args.workdir == "." and args.func(args) == 2
    assert capsys.readouterr().err.strip() == "rolecast sandbox run: workdir .: No such file or directory"


def test_a_terminated_command_hands_the_workdir_back(workdir):
    """`timeout`, `docker stop` and systemd stop a command with SIGTERM: the workdir, lent to the
    sandbox's uid while it runs, goes back to its owner and mode, as after Ctrl-C."""
    (workdir / "mine.txt").write_text("hi")
    before = workdir.stat()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "sandbox", "run", "--timeout", "60",
                             "--workdir", str(workdir), "--", "sleep", "30"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while workdir.stat().st_uid == before.st_uid and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the sandbox's uid holds it
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and "rolecast: terminated" in err, err
    for path in (workdir, workdir / "mine.txt"):
        assert (path.stat().st_uid, path.stat().st_gid) == (before.st_uid, before.st_gid)
    assert workdir.stat().st_mode == before.st_mode


def test_a_signal_while_lending_the_workdir_hands_it_back(workdir, monkeypatch):
    """Ctrl-C or SIGTERM between lending the workdir's top and its files left it owned by the
    sandbox's uid, mode 0700."""
    (workdir / "mine.txt").write_text("hi")
    before = workdir.stat()
    real = runner.chown_tree

    def interrupted_lend(root, uid, gid, **kw):
        if kw:  # the hand-back
            return real(root, uid, gid, **kw)
        os.chown(root, uid, gid)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "chown_tree", interrupted_lend)
    with pytest.raises(KeyboardInterrupt):
        run(["true"], workdir)
    for path in (workdir, workdir / "mine.txt"):
        assert (path.stat().st_uid, path.stat().st_gid) == (before.st_uid, before.st_gid)
    assert workdir.stat().st_mode == before.st_mode

@pytest.mark.skipif(not cgroup.available(), reason="no writable cgroup-v1 memory controller")
def test_a_signal_inside_the_cgroup_join_does_not_kill_the_caller():
    """A SIGTERM landing while the spawning thread sits in a run's memory group (before `joined`
    moved it back) made the clean-up SIGKILL its own process: `sandbox run` exited -9 with the
    workdir still lent out. Run in a child, since the old fault kills whoever calls it."""
    script = (
        "import threading\n"
        "from sandboxes import cgroup\n"
        f"group = cgroup.MemoryGroup.create('signal-in-join-{os.getpid()}', 64 << 20)\n"
        "(group.path / 'tasks').write_text(str(threading.get_native_id()))\n"
        "group.destroy()\n"
        "print('alive', group.path.exists())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "alive False\n"), done.stderr


@pytest.mark.skipif(not cgroup.available(), reason="no writable cgroup-v1 memory controller")
def test_a_runs_memory_group_is_removed(workdir):
    group = cgroup._own_group() / "rolecast-sandbox" / f"pid-{os.getpid()}-{threading.get_native_id()}"
    assert run(["true"], workdir, backend="none", allow_unsafe=True).ok
    assert not group.exists()


@pytest.mark.skipif(not cgroup.available(), reason="no writable cgroup-v1 memory controller")
def test_a_group_left_by_a_killed_run_is_removed_and_its_name_taken_again():
    """A rolecast SIGKILLed leaves its empty groups (docs, Known limits): the next run of that name
    removes the stale one, rather than leave it there for good and take a name beside it."""
    stale = cgroup._own_group() / "rolecast-sandbox" / f"stale-{os.getpid()}"
    stale.mkdir()
    group = cgroup.MemoryGroup.create(stale.name, 64 << 20)
    try:
        assert group.path == stale and not stale.with_name(f"{stale.name}.1").exists()
        limits = [group.path / f"memory.{kind}limit_in_bytes" for kind in ("", "memsw.")]
        assert {path.read_text() for path in limits if path.exists()} == {f"{64 << 20}\n"}  # no escape into swap
    finally:
        group.destroy()
        for leftover in (stale, stale.with_name(f"{stale.name}.1")):
            if leftover.exists():
                leftover.rmdir()


def test_concurrent_runs_of_backend_none_keep_their_own_memory_groups(tmp_path):
    """Runs of one process without a uid each take a group named by their thread: sharing one, the
    second run's start removed the first's group as left by a crash, killing the first run."""
    results = {}

    def go(name: str) -> None:
        (tmp_path / name).mkdir()
        results[name] = run("sleep 1; echo ok", tmp_path / name, Limits(wall_time_s=20), backend="none",
                            allow_unsafe=True)

    threads = [threading.Thread(target=go, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [(r.exit_code, r.stdout) for r in results.values()] == [(0, "ok\n")] * 2


def test_a_group_that_will_not_empty_is_given_up_on(tmp_path, monkeypatch):
    """A process stuck in the kernel never leaves: the kill ends at its timeout, not never."""
    (tmp_path / "group").mkdir()
    (tmp_path / "group" / "cgroup.procs").write_text("4194304\n")  # past pid_max: SIGKILL finds no one
    (tmp_path / "tasks").write_text("")
    group, result = cgroup.MemoryGroup(tmp_path / "group", tmp_path), []
    waiter = threading.Thread(target=lambda: result.append(group.kill_all(timeout_s=0.2)), daemon=True)
    waiter.start()
    waiter.join(10)
    assert result == [False]


def test_a_group_left_that_will_not_go_does_not_fail_the_next_run_of_its_name(tmp_path, monkeypatch):
    """A group of the same name left by an earlier run (a process stuck in the kernel keeps it):
    each later run leasing that uid was a FileExistsError traceback; it takes a name of its own."""
    (tmp_path / "rolecast-sandbox" / "uid-5").mkdir(parents=True)
    monkeypatch.setattr(cgroup, "_own_group", lambda: tmp_path)
    monkeypatch.setattr(cgroup.MemoryGroup, "kill_all", lambda self, timeout_s=5.0: False)
    group = cgroup.MemoryGroup.create("uid-5", 1 << 20)
    assert group.path == tmp_path / "rolecast-sandbox" / "uid-5.1"
    assert (group.path / "memory.limit_in_bytes").read_text() == str(1 << 20)
