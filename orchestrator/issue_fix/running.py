"""Running commands in a task's repo: a runner (on this machine, or confined in a sandbox), the
repo's fresh copies, and patches applied to them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import sandboxes
from sandboxes.pool import copy_private

from .task import IGNORED, IssueTask


@dataclass
class RunOutcome:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


# (argv, workdir, timeout_s): grading reads pytest's junit report back from the workdir, so a
# runner must share it (a run that leaves no report there is graded as a crash)
Runner = Callable[[list[str], Path, float], RunOutcome]


# Byte code is not written (a patched file of the same size in the same second would otherwise
# reuse a stale .pyc) and pytest plugins are not auto-loaded (task repos are stdlib-only; faster).
TEST_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

# Text to and from the commands is UTF-8 whatever the locale (LC_ALL=C encoded a patch in ASCII,
# and raised on its é), and bytes that are not UTF-8 (a test printing b"\xff") are replaced with
# U+FFFD, as a sandbox's output is, not a UnicodeDecodeError.
TEXT = {"encoding": "utf-8", "errors": "replace"}


def _own_interpreter(argv: list[str]) -> list[str]:
    """``python``/``python3`` as the program becomes ``sys.executable`` (no pyenv shim), and
    ``pytest`` its ``-m pytest`` (a virtualenv's scripts are on no sandbox's PATH: exit 127)."""
    argv = list(argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    elif argv and argv[0] in ("pytest", "py.test"):
        argv[:1] = [sys.executable, "-m", "pytest"]
    return argv


def subprocess_runner(argv: list[str], workdir: Path, timeout_s: float) -> RunOutcome:
    """Run ``argv`` in ``workdir`` on this machine (no isolation: trusted code only)."""
    argv = _own_interpreter(argv)
    env = {**os.environ, **TEST_ENV}
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run(
            argv, cwd=workdir, env=env, capture_output=True, **TEXT, timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return RunOutcome(124, out, err, timed_out=True)
    except OSError as exc:
        return RunOutcome(127, "", f"cannot run {argv[0]!r}: {exc}")
    return RunOutcome(proc.returncode, proc.stdout, proc.stderr)


def sandbox_runner(backend: str = "auto", memory_mb: int = 1024, timeout_s: float | None = None,
                   hide: tuple[Path, ...] = ()) -> Runner:
    """A :data:`Runner` that confines each command with :func:`sandboxes.run` (needs root).

    The wall-time limit is ``timeout_s`` if given, else what the caller passes per command (the
    task's); ``hide``: host folders the commands may not read. Raises ``sandboxes.SandboxError``
    now, not per run, when ``backend`` cannot work here.
    """
    chosen = sandboxes.select_backend(backend).name

    def run(argv: list[str], workdir: Path, task_timeout_s: float) -> RunOutcome:
        limits = sandboxes.Limits(wall_time_s=timeout_s or task_timeout_s, memory_mb=memory_mb)
        res = sandboxes.run(_own_interpreter(argv), workdir, limits, backend=chosen, env=TEST_ENV,
                             hide=hide)
        code = res.exit_code if res.exit_code is not None else 128 + (res.signal or 0)
        # the team reads the output's tail: an OOM kill was "crashed (exit 137)" and nothing more
        notes = "".join(f"\n[sandbox] {why}\n" for hit, why in (
            (res.out_of_memory, f"killed at the memory limit ({memory_mb} MB)"),
            (res.truncated, f"output cut at {limits.max_output_bytes} bytes"),
        ) if hit)
        return RunOutcome(124 if res.timed_out else code, res.stdout, res.stderr + notes, timed_out=res.timed_out)

    return run


def copy_repo(task: IssueTask, dest: str | Path) -> Path:
    """A fresh copy of the task's buggy repo at ``dest`` (which must not exist or be empty)."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest}: not empty")
    if dest.exists():
        dest.rmdir()
    return copy_private(task.repo_dir, dest, ignore=IGNORED)


def apply_patch(workdir: str | Path, patch_text: str) -> tuple[bool, str]:
    """Apply a unified diff (paths ``a/...`` ``b/...``) inside ``workdir``; never raises.

    Uses ``git apply`` (checked first, so a failing patch changes nothing) and falls back to
    ``patch -p1`` where git is missing. Returns ``(ok, message from the tool)``.
    """
    workdir = Path(workdir)
    if not patch_text.strip():
        return False, "empty patch"
    if not patch_text.endswith("\n"):
        patch_text += "\n"
    git, patch = shutil.which("git"), shutil.which("patch")
    try:
        if git:
            # --unsafe-paths is not given: a patch may not touch files outside the workdir.
            base = [git, "apply", "-p1", "--whitespace=nowarn"]
            env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(workdir.resolve().parent)}
            chk = subprocess.run(base + ["--check", "-"], cwd=workdir, input=patch_text,
                                 capture_output=True, **TEXT, timeout=60, env=env)
            if chk.returncode != 0:
                return False, (chk.stderr or chk.stdout).strip() or "git apply --check failed"
            res = subprocess.run(base + ["-"], cwd=workdir, input=patch_text,
                                 capture_output=True, **TEXT, timeout=60, env=env)
            return res.returncode == 0, (res.stderr or res.stdout).strip() or "applied with git apply"
        if patch:
            base = [patch, "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-s"]
            chk = subprocess.run(base + ["--dry-run"], cwd=workdir, input=patch_text,
                                 capture_output=True, **TEXT, timeout=60)
            if chk.returncode != 0:
                return False, (chk.stdout + chk.stderr).strip() or "patch --dry-run failed"
            res = subprocess.run(base, cwd=workdir, input=patch_text,
                                 capture_output=True, **TEXT, timeout=60)
            return res.returncode == 0, (res.stdout + res.stderr).strip() or "applied with patch -p1"
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"could not run the patch tool: {exc}"
    return False, "neither git nor patch is installed"
