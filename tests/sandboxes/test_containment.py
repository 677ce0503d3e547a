"""Attacks from inside the sandbox; each asserts the HOST-side effect is absent."""
from __future__ import annotations

import fcntl
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandboxes import cgroup
from sandboxes.confine import LOCK_DIR, UID_BASE, UID_SLOTS

PY = sys.executable


def leaked_sandbox_processes() -> list[int]:
    """Live (non-zombie) host processes of a sandbox uid that no run holds any more: a run keeps
    its uid's lock until it has killed what it started, so a process of a released uid outlived
    its run. (Runs of other tests, in other pytest-xdist workers, hold their uids' locks.)"""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            uid, live = _owner(entry)
            if live and UID_BASE <= uid < UID_BASE + UID_SLOTS and not _held(uid - UID_BASE):
                # seen again after its uid was seen free: a run that ended meanwhile is gone by now
                if _owner(entry) == (uid, True):
                    pids.append(int(entry.name))
    return pids


def _owner(entry: Path) -> tuple[int, bool]:
    """A /proc entry's uid, and whether it is a live (non-zombie) process."""
    try:
        uid = entry.stat().st_uid
        state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return -1, False
    return uid, state != "Z"


def _held(slot: int) -> bool:
    fd = os.open(LOCK_DIR / str(slot), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_fork_bomb_is_capped_and_fully_reaped(sandbox, marker, processes_with):
    bomb = f"import os\nwhile True:\n    try: os.fork()\n    except OSError: pass  # {marker}"
    r = sandbox([PY, "-c", bomb], wall_time_s=2.0, max_processes=20)
    assert r.timed_out
    assert r.duration_s < 5
    assert processes_with(marker) == []
    # a run elsewhere whose holder died abruptly frees its lock before its children finish dying
    deadline = time.monotonic() + 3
    while (leaked := leaked_sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leaked == []


def test_the_process_limit_is_exact(sandbox):
    """max_processes counts the run's tasks, its first one too: threads start until the limit."""
    spawn = ("import threading\nn = 0\ntry:\n    while True:\n"
             "        threading.Thread(target=threading.Event().wait, daemon=True).start(); n += 1\n"
             "except RuntimeError:\n    print(n)")
    r = sandbox([PY, "-c", spawn], max_processes=6)
    assert r.stdout == "5\n", r.stderr


def test_memory_bomb_is_killed_at_the_limit(sandbox):
    hog = "x = []\nwhile True: x.append(bytearray(16 << 20))"
    r = sandbox([PY, "-c", hog], memory_mb=96)
    assert r.exit_code != 0 and not r.timed_out
    # With the cgroup the kernel OOM-kills (flagged); without it RLIMIT_AS raises MemoryError.
    assert r.out_of_memory or "MemoryError" in r.stderr


def test_without_a_memory_cgroup_the_address_space_is_capped(sandbox, monkeypatch):
    """Where no cgroup-v1 memory controller is writable, RLIMIT_AS is the memory limit."""
    monkeypatch.setattr(cgroup, "_own_group", lambda: None)
    r = sandbox([PY, "-c", "x = [bytearray(16 << 20) for _ in range(32)]; print('got 512 MB')"], memory_mb=96)
    assert "MemoryError" in r.stderr and r.stdout == "" and not r.out_of_memory


def test_infinite_loop_is_stopped_by_cpu_limit(sandbox, marker, processes_with):
    # a wall limit far off: the CPU limit must fire first however busy the host (at 3 s it failed
    # once other sessions left the loop less than a third of a core)
    r = sandbox([PY, "-c", f"while True: pass  # {marker}"], wall_time_s=60.0, cpu_time_s=1)
    assert not r.timed_out and r.signal in (signal.SIGXCPU, signal.SIGKILL)
    assert processes_with(marker) == []


def test_the_cpu_limit_defaults_to_the_wall_time_rounded_up(sandbox):
    r = sandbox("ulimit -t", wall_time_s=2.5)
    assert r.stdout == "3\n", r.stderr


def test_sleeping_past_deadline_is_killed(sandbox, workdir):
    r = sandbox("sleep 2; touch late", wall_time_s=1.0)
    assert r.timed_out and r.signal == signal.SIGKILL
    assert r.duration_s >= 1.0
    time.sleep(1.3)
    assert not (workdir / "late").exists()  # killed before the sleep ended (no wall-clock bound: CI may be loaded)


def test_daemon_does_not_survive_the_run(sandbox, workdir, marker, processes_with):
    tag = marker + "-daemon"
    daemon = f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1)\n    open('late', 'w').write('{tag}')\n"
    r = sandbox([PY, "-c", daemon, tag])
    assert r.exit_code == 0
    assert processes_with(tag) == []
    time.sleep(1.5)
    assert not (workdir / "late").exists()


def test_daemon_left_at_the_deadline_is_killed(sandbox, workdir, marker, processes_with):
    tag = marker + "-daemon"
    r = sandbox(f"(setsid sh -c 'sleep 1; touch late; : {tag}' &); sleep 30", wall_time_s=0.5)
    assert r.timed_out
    assert processes_with(tag) == []
    time.sleep(1.5)
    assert not (workdir / "late").exists()


def test_output_flood_is_truncated(sandbox):
    r = sandbox("yes flood", wall_time_s=1.0, max_output_bytes=10_000)
    assert r.truncated and r.timed_out
    assert len(r.stdout) == 10_000 and r.stderr == ""


def test_output_of_exactly_the_limit_is_whole(sandbox):
    """max_output_bytes per stream: that many bytes are all kept and not flagged; one more is cut."""
    r = sandbox("head -c 10000 /dev/zero | tr '\\0' x; head -c 10001 /dev/zero >&2", max_output_bytes=10_000)
    assert len(r.stdout) == len(r.stderr) == 10_000 and r.truncated  # stderr was cut
    r = sandbox("head -c 10000 /dev/zero | tr '\\0' x", max_output_bytes=10_000)
    assert r.stdout == "x" * 10_000 and not r.truncated


def test_core_dumps_are_off_whatever_the_callers_limit(sandbox):
    """RLIMIT_CORE is inherited: under a caller that allows core dumps, a crashing command's would
    be dumped (the docs say they are disabled)."""
    before = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    try:
        r = sandbox("ulimit -c")
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, before)
    assert r.stdout == "0\n", r.stderr


def test_writes_outside_workdir_do_not_reach_host(sandbox, marker):
    targets = [Path(d) / marker for d in ("/var/tmp", "/tmp", "/etc", "/root", "/dev/shm", "/work")]
    script = "; ".join(f"echo x > {t}" for t in targets)
    r = sandbox(script)
    assert r.exit_code != 0
    assert [t for t in targets if t.exists()] == []


def test_the_new_root_is_mounted_read_only(sandbox):
    # its folders are root's and 0755 as well, so the uid cannot write there either way: the mount is the second lock
    r = sandbox("awk '$2 == \"/\" {print $4}' /proc/self/mounts")
    assert r.ok and r.stdout and {opts.split(",")[0] for opts in r.stdout.split()} == {"ro"}, r.stdout + r.stderr


def test_host_secrets_are_unreadable(sandbox, host_process, marker):
    secret = marker + "-secret"
    pid = host_process.pid
    r = sandbox(
        f"cat /etc/shadow; env; cat /proc/1/environ /proc/$PPID/environ /proc/{pid}/environ /proc/*/environ; "
        f"cat /root/.bashrc; ls /root"
    )
    shadow = Path("/etc/shadow").read_text()
    out = r.stdout + r.stderr
    assert secret not in out
    assert "root:" not in r.stdout and shadow.splitlines()[0] not in out
    assert ".bashrc" not in r.stdout


def test_only_the_system_folders_of_the_host_are_seen(sandbox, marker):
    """The sandbox saw / read-only: a readable file anywhere (a recipe's tasks, a run's config.yaml
    holding a code_pair task's hidden tests) was the code's to read. Now only the system folders
    (and the running Python) are there."""
    data = Path("/var/tmp") / marker  # stands for any host folder that holds data: /work, /srv...
    data.mkdir()
    try:
        (data / "tasks.jsonl").write_text('{"tests": [[1, 4]]}\n')
        data.chmod(0o755)
        (data / "tasks.jsonl").chmod(0o644)
        r = sandbox(f"cat {data}/tasks.jsonl; cat {__file__}; ls /; echo ==; ls /etc/hostname /usr/bin/env /bin/sh")
    finally:
        subprocess.run(["rm", "-rf", "--", str(data)], check=True)
    assert "[[1, 4]]" not in r.stdout and "def test_only_the_system_folders" not in r.stdout
    top, seen = map(str.split, r.stdout.split("=="))
    assert set(top) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr",
                   *(p.parts[1] for p in map(Path, (sys.prefix, sys.base_prefix)))}, top
    assert seen == ["/bin/sh", "/etc/hostname", "/usr/bin/env"], r.stderr


def test_parent_environment_is_not_inherited(sandbox, marker, monkeypatch):
    monkeypatch.setenv("ROLECAST_TEST_SECRET", marker)
    r = sandbox("env; cat /proc/self/environ /proc/1/environ")
    assert marker not in r.stdout + r.stderr
    assert "ROLECAST_TEST_SECRET" not in r.stdout


def test_no_network_egress(sandbox):
    connections: list[object] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.1)
        port = server.getsockname()[1]
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    connections.append(server.accept())
                except TimeoutError:
                    continue

        t = threading.Thread(target=accept)
        t.start()
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)"
        r = sandbox([PY, "-c", connect])
        r2 = sandbox(f"echo hi > /dev/tcp/127.0.0.1/{port}; getent hosts example.com")
        time.sleep(0.2)
        stop.set()
        t.join()
    assert r.exit_code != 0 and ("refused" in r.stderr or "unreachable" in r.stderr)
    assert r2.exit_code != 0
    assert connections == []


def test_host_unix_sockets_under_run_are_unreachable(sandbox, marker):
    """A read-only mount does not stop connect(2): a daemon's world-writable socket in /run (dbus,
    postgresql) answered the sandbox."""
    path = Path("/run") / f"{marker}.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        try:
            path.chmod(0o777)
            server.listen()
            server.setblocking(False)
            r = sandbox([PY, "-c", f"import socket; socket.socket(socket.AF_UNIX).connect({str(path)!r})"])
            with pytest.raises(BlockingIOError):
                server.accept()
        finally:
            path.unlink()
    assert r.exit_code != 0 and "FileNotFoundError" in r.stderr


def test_host_ipc_objects_are_unreachable(sandbox):
    """SysV IPC is per IPC namespace: a host queue or segment left open to all (0666) was the
    child's to read, fill or remove without --unshare-ipc / --ipc."""
    made = subprocess.run(["ipcmk", "-Q", "-p", "0666"], capture_output=True, text=True, check=True)
    qid = made.stdout.split()[-1]
    try:
        r = sandbox(f"ipcs -q -i {qid}")
    finally:
        subprocess.run(["ipcrm", "-q", qid], check=True)
    assert f"id {qid} not found" in r.stderr, r.stdout


def test_cannot_kill_host_processes(sandbox, host_process):
    r = sandbox(f"kill -9 {host_process.pid} {os.getpid()} $PPID 1; kill -9 -1")
    assert host_process.poll() is None  # still running
    os.kill(os.getpid(), 0)  # and so is the test process (trivially, but explicitly)
    assert r.duration_s < 3


def test_filling_the_disk_is_bounded(sandbox, workdir):
    r = sandbox(
        "for i in 1 2 3 4 5; do dd if=/dev/zero of=/tmp/fill$i bs=1M count=4 2>/dev/null; done; cat /tmp/fill* | wc -c;"
        "dd if=/dev/zero of=fill bs=1M count=200 2>/dev/null; true",
        tmp_size_mb=8, max_file_size_mb=4,
    )
    # the private /tmp tmpfs is full at its cap (files under the size limit: one big file stopped
    # at that limit, whatever the tmpfs's size)
    assert 4 << 20 <= int(r.stdout.split()[0]) <= 8 << 20
    assert (workdir / "fill").stat().st_size <= 4 << 20
    assert not Path("/tmp/fill").exists()
    # what the sandbox could write reached the host's disk only as the capped file (free space on
    # "/" moves with every other writer on the machine, so it is no measure)
    assert sum(p.stat().st_size for p in workdir.rglob("*") if p.is_file()) <= 4 << 20


def test_huge_single_file_hits_fsize_limit(sandbox, workdir):
    r = sandbox([PY, "-c", "open('big', 'wb').write(bytes(50 << 20))"], max_file_size_mb=2)
    assert r.exit_code != 0
    assert (workdir / "big").stat().st_size <= 2 << 20


def test_other_processes_are_invisible(sandbox, host_process, marker):
    r = sandbox(f"cat /proc/*/cmdline; ls /proc/{host_process.pid}; ls -d /proc/[0-9]*")
    assert marker not in r.stdout
    pids = [int(p) for p in re.findall(r"^/proc/(\d+)$", r.stdout, re.M)]
    assert host_process.pid not in pids and len(pids) < 10


def test_symlink_escape_does_not_touch_host_file(sandbox, workdir, marker):
    host_file = Path("/var/tmp") / marker
    host_file.write_text("host secret")
    host_file.chmod(0o600)
    try:
        (workdir / "link").symlink_to(host_file)
        (workdir / "etc").symlink_to("/etc")
        r = sandbox("cat link; echo pwned > link; echo pwned >> link; echo x > etc/passwd; rm -f etc/hostname")
        assert "host secret" not in r.stdout
        assert host_file.read_text() == "host secret"
        st = host_file.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)  # the chown-back did not follow it
        assert Path("/etc/hostname").exists() and "pwned" not in Path("/etc/passwd").read_text()
    finally:
        host_file.unlink()


def test_setuid_and_capability_tricks_gain_nothing(sandbox, marker):
    r = sandbox(
        "grep -E '^(Cap(Inh|Eff|Prm|Bnd|Amb)|NoNewPrivs)' /proc/self/status; id -u; echo groups=$(id -g; id -G); "
        "unshare -r sh -c 'id -u; touch /etc/" + marker + "' ; "
        "su -c 'touch /etc/" + marker + "' root </dev/null; "
        "mount -t tmpfs none /mnt; "
        + f"{PY} -c 'import os; os.setuid(0)'; echo setuid_rc=$?",
        wall_time_s=30,  # su's failed login waits about 1 s: of a loaded machine's default 3
    )
    caps = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("Cap")]
    assert len(caps) == 5 and all(int(c, 16) == 0 for c in caps), caps
    assert "NoNewPrivs:\t1" in r.stdout  # no setuid binary (a sudo, a su with a known password) gains anything
    uid = int([line for line in r.stdout.splitlines() if line.isdigit()][0])
    assert UID_BASE <= uid < UID_BASE + UID_SLOTS
    assert f"groups={uid} {uid}\n" in r.stdout  # root's group would open the host's files of group 0
    assert "setuid_rc=1" in r.stdout
    assert not Path("/etc", marker).exists()


# The parent's Popen kills the parent as soon as the sandbox is spawned: its children have not
# armed their parent-death signals yet (the command's setup, without start_new_session, is spared).
_DIE_AT_SPAWN = """
import os, subprocess
class DyingPopen(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if kwargs.get("start_new_session"):
            os.kill(os.getpid(), 9)
subprocess.Popen = DyingPopen
"""


@pytest.mark.parametrize("moment", ["at-spawn", "once-it-runs"])
def test_sandbox_dies_with_its_parent(backend, workdir, marker, processes_with, moment):
    """SIGKILL the Python that started the sandbox: nothing it started may live on.

    At spawn, bwrap and unshare (and their namespaces' inits) arm their parent-death signals
    too late, and lived on with the command for its whole wall time."""
    tag = marker + "-orphan"
    sandboxed = [PY, "-c", "import time; time.sleep(30)", tag]
    code = (
        (_DIE_AT_SPAWN if moment == "at-spawn" else "")
        + "import sys; from sandboxes import run, Limits\n"
        f"run({sandboxed!r}, {str(workdir)!r}, Limits(wall_time_s=30),"
        f" backend={backend!r})\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    if moment == "once-it-runs":
        # `sleep 30 <tag>` exited at once (an invalid interval), and the parent's own command
        # line, which holds the tag too, was taken for the sandboxed one: the test passed
        # whatever the sandbox did, without --die-with-parent too. bwrap's and unshare's
        # command lines hold the tag as well, as do the parent's children until they exec
        # (chown's, the sandbox's): wait for the sandboxed Python itself.
        def started() -> list[int]:
            return [pid for pid in processes_with(tag) if _argv(pid) == sandboxed]

        deadline = time.monotonic() + 60  # the parent imports, unshare mounts: slow on a loaded machine
        while not started() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.02)
        assert started(), f"the sandboxed sleep never started; the parent: {parent.poll()} {parent.stderr.read() if parent.poll() is not None else ''}"
        parent.kill()
    assert parent.wait() == -signal.SIGKILL
    parent.stderr.close()
    deadline = time.monotonic() + 10
    while processes_with(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(tag) == []


def _argv(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return None


def test_the_lifeline_watcher_stays_out_of_the_commands_way(sandbox):
    """The command's stdin is /dev/null, it holds no copy of the lifeline, and the watcher is
    not its child: a command reaping every child it has would have waited on it forever."""
    probe = ("import os\n"
             "print(os.readlink('/proc/self/fd/0'), repr(os.read(0, 10)))\n"
             "try:\n    os.fstat(3)\nexcept OSError:\n    print('no fd 3')\n"
             "try:\n    os.waitpid(-1, 0)\nexcept ChildProcessError:\n    print('no children')\n")
    r = sandbox([PY, "-c", probe])
    assert r.stdout == "/dev/null b''\nno fd 3\nno children\n", r.stderr
