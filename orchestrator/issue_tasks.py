"""Issue-fixing tasks: load a task folder, hand a team a fresh copy of the buggy repo, grade it.

A task is a folder ``tasks/<id>/``::

    task.yaml        id, title, kind, issue, test_command, visible_tests, hidden_tests, ...
    repo/            the project with the bug (what the team sees and edits)
    hidden_tests/    tests copied into the repo at grading time only
    solution.patch   a unified diff against repo/ (paths a/... b/...) that fixes the bug

Grading copies ``hidden_tests/`` to ``<workdir>/<hidden_dest>`` (default ``tests/hidden``), runs
``test_command`` on those files only and returns one outcome per hidden test as pytest names it
(each case of a parametrized test is one); the reward is the fraction that passed. Every command
goes through a ``runner`` so that a sandbox can be plugged in.
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .edits import is_regular, read_regular
from .errors import ConfigError
from .validation import validate_model
from .yamlfile import load_yaml

__all__ = [
    "IssueTask",
    "RunOutcome",
    "Runner",
    "TestOutcome",
    "Grade",
    "CheckReport",
    "TaskFileError",
    "load_task",
    "load_tasks",
    "copy_repo",
    "apply_patch",
    "install_hidden_tests",
    "grade",
    "grade_work",
    "graded_path",
    "workdir_changes",
    "repo_files",
    "run_tests",
    "static_test_names",
    "check_task",
    "subprocess_runner",
    "sandbox_runner",
]

TASK_FILE = "task.yaml"
PATCH_FILE = "solution.patch"
REPORT_FILE = ".rolecast-grade.xml"  # junit report, written inside the workdir
_ID_RE = re.compile(r"^[a-z0-9]+([-_][a-z0-9]+)*$")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", REPORT_FILE)


# --------------------------------------------------------------------------------------- model


class TaskFileError(ConfigError, ValueError):
    """A bad task folder: one line ``FILE:LINE: KEY: problem``; a ValueError too, for older callers."""


class IssueTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="lowercase slug (e.g. 001-short-slug), equal to the folder name")
    title: str
    issue: str = Field(description="the bug report the team is given")
    test_command: str = Field(description="pytest invocation run from the repo root")
    visible_tests: list[str] = Field(min_length=1, description="paths in repo/ the team may run")
    hidden_tests: str = Field(default="hidden_tests", description="folder, relative to the task")
    hidden_dest: str = Field(default="tests/hidden", description="where hidden tests go in repo/")
    kind: str = Field(default="", description="bug category, e.g. off-by-one")
    timeout_s: float = Field(default=60.0, gt=0)
    path: Path | None = Field(default=None, description="the task folder (set by load_task)")

    @field_validator("id")
    @classmethod
    def _id_shape(cls, v: str) -> str:
        if not _ID_RE.match(v):
            raise ValueError("must be a lowercase slug like 001-fix-parser or my_task (a-z, 0-9, - and _)")
        return v

    @field_validator("title", "issue", "test_command")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("hidden_dest", "hidden_tests")
    @classmethod
    def _relative(cls, v: str) -> str:
        p = Path(v)
        if p.is_absolute() or ".." in p.parts or not p.parts:
            raise ValueError("must be a relative path inside the task")
        return v

    # -- folders
    @property
    def folder(self) -> Path:
        if self.path is None:
            raise ValueError(f"task {self.id}: no folder (load it with load_task)")
        return self.path

    @property
    def repo_dir(self) -> Path:
        return self.folder / "repo"

    @property
    def hidden_dir(self) -> Path:
        return self.folder / self.hidden_tests

    @property
    def patch_path(self) -> Path:
        return self.folder / PATCH_FILE

    def solution_patch(self) -> str:
        return self.patch_path.read_text(encoding="utf-8")

    def solution_files(self) -> list[str]:
        """Repo-relative paths of the files ``solution.patch`` changes or adds."""
        found = re.findall(r"^\+\+\+ b/(\S+)", self.solution_patch(), re.M)
        return sorted(set(found))

    def hidden_test_files(self) -> list[str]:
        """Hidden test files as paths relative to the repo root once installed."""
        return sorted(
            f"{self.hidden_dest}/{p.relative_to(self.hidden_dir).as_posix()}"
            for p in self.hidden_dir.rglob("test_*.py")
        )

    def hidden_test_ids(self) -> list[str]:
        """``file::name`` of every hidden test, read statically (functions and Test* methods)."""
        ids: list[str] = []
        for rel in self.hidden_test_files():
            src = self.hidden_dir / Path(rel).relative_to(self.hidden_dest)
            ids += [f"{rel}::{n}" for n in static_test_names(src.read_text(encoding="utf-8"))]
        return ids


def static_test_names(source: str) -> list[str]:
    """Test functions and ``Test*`` methods in ``source`` (raises SyntaxError if it does not parse)."""
    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names += [
                f"{node.name}::{m.name}"
                for m in node.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")
            ]
    return names


def load_task(dir: str | Path) -> IssueTask:
    """Load and validate ``dir/task.yaml``; raise :class:`TaskFileError` if bad."""
    try:
        return _read_task(Path(dir))
    except ConfigError as exc:  # load_yaml's and validate_model's, as the task's own error type
        raise TaskFileError(exc.file, exc.line, exc.key, exc.problem) from None


def _read_task(folder: Path) -> IssueTask:
    doc = load_yaml(folder / TASK_FILE)
    if not isinstance(doc.data, dict):
        raise doc.error((), "expected a mapping of keys")
    if "path" in doc.data:
        raise doc.error(("path",), "unknown key (the folder is set by the loader)")
    task: IssueTask = validate_model(IssueTask, {**doc.data, "path": folder}, doc)
    if task.id != folder.name:
        raise doc.error(("id",), f"{task.id!r} does not match the folder name {folder.name!r}")
    if not task.repo_dir.is_dir():
        raise ConfigError(doc.path, None, "(folder)", f"no repo/ folder next to {TASK_FILE}")
    if not task.hidden_dir.is_dir():
        raise doc.error(("hidden_tests",), f"folder {task.hidden_tests!r} not found")
    if not task.hidden_test_files():
        raise doc.error(("hidden_tests",), f"no test_*.py files in {task.hidden_tests!r}")
    for i, rel in enumerate(task.visible_tests):
        if not (task.repo_dir / rel).exists():
            raise doc.error(("visible_tests", i), f"{rel!r} not found in repo/")
    try:
        shlex.split(task.test_command)
    except ValueError as exc:
        raise doc.error(("test_command",), f"cannot be split: {exc}") from None
    return task


def load_tasks(root: str | Path) -> list[IssueTask]:
    """Every task folder (one holding task.yaml) under ``root``, sorted by id."""
    return [load_task(p.parent) for p in sorted(Path(root).glob(f"*/{TASK_FILE}"))]


# --------------------------------------------------------------------------------------- running


@dataclass
class RunOutcome:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


Runner = Callable[[list[str], Path, float], RunOutcome]


# Byte code is not written (a patched file of the same size in the same second would otherwise
# reuse a stale .pyc) and pytest plugins are not auto-loaded (task repos are stdlib-only; faster).
TEST_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def _own_interpreter(argv: list[str]) -> list[str]:
    """``python``/``python3`` as the program becomes ``sys.executable`` (no pyenv shim)."""
    argv = list(argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def subprocess_runner(argv: list[str], workdir: Path, timeout_s: float) -> RunOutcome:
    """Run ``argv`` in ``workdir`` on this machine (no isolation: trusted code only)."""
    argv = _own_interpreter(argv)
    env = {**os.environ, **TEST_ENV}
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run(
            argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return RunOutcome(124, out, err, timed_out=True)
    except OSError as exc:
        return RunOutcome(127, "", f"cannot run {argv[0]!r}: {exc}")
    return RunOutcome(proc.returncode, proc.stdout, proc.stderr)


def sandbox_runner(backend: str = "auto", memory_mb: int = 1024, timeout_s: float | None = None) -> Runner:
    """A :data:`Runner` that confines each command with :func:`sandboxes.run` (needs root).

    The wall-time limit is ``timeout_s`` if given, else what the caller passes per command (the
    task's). Raises ``sandboxes.SandboxError`` now, not per run, when ``backend`` cannot work here.
    """
    import sandboxes  # optional package: only this runner needs it

    chosen = sandboxes.select_backend(backend).name

    def run(argv: list[str], workdir: Path, task_timeout_s: float) -> RunOutcome:
        limits = sandboxes.Limits(wall_time_s=timeout_s or task_timeout_s, memory_mb=memory_mb)
        res = sandboxes.run(_own_interpreter(argv), workdir, limits, backend=chosen, env=TEST_ENV)
        code = res.exit_code if res.exit_code is not None else 128 + (res.signal or 0)
        return RunOutcome(124 if res.timed_out else code, res.stdout, res.stderr, timed_out=res.timed_out)

    return run


def copy_repo(task: IssueTask, dest: str | Path) -> Path:
    """A fresh copy of the task's buggy repo at ``dest`` (which must not exist or be empty)."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest}: not empty")
    if dest.exists():
        dest.rmdir()
    shutil.copytree(task.repo_dir, dest, ignore=_IGNORED)
    return dest


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
                                 capture_output=True, text=True, timeout=60, env=env)
            if chk.returncode != 0:
                return False, (chk.stderr or chk.stdout).strip() or "git apply --check failed"
            res = subprocess.run(base + ["-"], cwd=workdir, input=patch_text,
                                 capture_output=True, text=True, timeout=60, env=env)
            return res.returncode == 0, (res.stderr or res.stdout).strip() or "applied with git apply"
        if patch:
            base = [patch, "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-s"]
            chk = subprocess.run(base + ["--dry-run"], cwd=workdir, input=patch_text,
                                 capture_output=True, text=True, timeout=60)
            if chk.returncode != 0:
                return False, (chk.stdout + chk.stderr).strip() or "patch --dry-run failed"
            res = subprocess.run(base, cwd=workdir, input=patch_text,
                                 capture_output=True, text=True, timeout=60)
            return res.returncode == 0, (res.stdout + res.stderr).strip() or "applied with patch -p1"
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"could not run the patch tool: {exc}"
    return False, "neither git nor patch is installed"


# --------------------------------------------------------------------------------------- grading

Status = Literal["passed", "failed", "error", "skipped"]


@dataclass
class TestOutcome:
    __test__ = False  # not a pytest class
    id: str  # "tests/hidden/test_x.py::test_name"
    status: Status
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "passed"


@dataclass
class Grade:
    task_id: str
    outcomes: list[TestOutcome]
    exit_code: int
    timed_out: bool = False
    crashed: bool = False  # collection error, internal error, timeout, no report
    log: str = ""  # tail of the test run's output
    ignored: list[str] = field(default_factory=list)  # team changes grading left out (grade_work)

    @property
    def passed(self) -> int:
        return sum(o.ok for o in self.outcomes)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def failed_ids(self) -> list[str]:
        return [o.id for o in self.outcomes if not o.ok]


def install_hidden_tests(task: IssueTask, workdir: str | Path) -> Path:
    """Copy the hidden tests to ``workdir/<hidden_dest>``, replacing whatever is there."""
    dest = Path(workdir) / task.hidden_dest
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(task.hidden_dir, dest, ignore=_IGNORED)
    return dest


def _pytest_argv(task: IssueTask, paths: list[str]) -> list[str]:
    return shlex.split(task.test_command) + paths + [
        f"--junitxml={REPORT_FILE}", "-o", "junit_family=xunit1", "-rA", "-p", "no:cacheprovider",
    ]


# A test id may end in "[params]" that hold spaces: "tests/x.py::test_x[a b] - message".
_RA_LINE = re.compile(
    r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+::[^\s\[]+(?:\[.*?\])?)(?:\s+-\s+(.*))?$", re.M)


def _parse_junit(text: str) -> dict[str, TestOutcome] | None:
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    found: dict[str, TestOutcome] = {}
    for case in root.iter("testcase"):
        name, file = case.get("name", ""), case.get("file", "")
        classname = case.get("classname", "")
        # xunit1 classname is "tests.hidden.test_x" or "tests.hidden.test_x.TestClass[.Nested]"
        module = Path(file).with_suffix("").as_posix().replace("/", ".") if file else ""
        cls = classname[len(module) + 1:].replace(".", "::") if module and classname.startswith(module + ".") else ""
        tid = "::".join(p for p in (file or classname, cls, name) if p)
        status: Status = "passed"
        message = ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = " ".join((child.get("message") or "").split())[:300]
                break
        if status == "error" and not name:  # a collection error has no test name
            continue
        if tid in found and found[tid].ok is False:
            continue  # keep the first failure (teardown errors add a second entry)
        found[tid] = TestOutcome(tid, status, message)
    return found


def _parse_ra(text: str) -> dict[str, TestOutcome]:
    table = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "error",
             "SKIPPED": "skipped", "XFAIL": "skipped"}
    found: dict[str, TestOutcome] = {}
    for word, tid, msg in _RA_LINE.findall(text):
        if tid not in found or found[tid].ok:
            found[tid] = TestOutcome(tid, table[word], (msg or "")[:300])  # type: ignore[arg-type]
    return found


def run_tests(task: IssueTask, workdir: Path, runner: Runner, paths: list[str],
               expected: list[str]) -> Grade:
    """Run pytest on ``paths``: one outcome per test id pytest reports (``file::name[params]``).

    ``expected`` holds static ids (``file::name``, see :meth:`IssueTask.hidden_test_ids`): one
    that no reported id matches counts as an error ("not run"); a crash makes each an error and
    drops whatever was reported.
    """
    report = workdir / REPORT_FILE
    report.unlink(missing_ok=True)
    out = runner(_pytest_argv(task, paths), workdir, task.timeout_s)
    log = (out.stdout + "\n" + out.stderr)[-4000:]
    found: dict[str, TestOutcome] | None = None
    if report.is_file():
        found = _parse_junit(report.read_text(encoding="utf-8", errors="replace"))
        report.unlink(missing_ok=True)
    if found is None:  # a runner that does not share the filesystem: read the -rA summary
        found = _parse_ra(out.stdout)
    # exit 0: all passed, 1: some failed; anything else (2 interrupted/collection error,
    # 3 internal error, 4 usage error, 5 nothing collected) or a timeout means a crash.
    crashed = out.timed_out or out.exit_code not in (0, 1) or not found
    if crashed:
        why = "timed out" if out.timed_out else f"test run crashed (exit {out.exit_code})"
        outcomes = [TestOutcome(tid, "error", why) for tid in expected]
    else:
        missing = [tid for tid in expected if not any(k == tid or k.startswith(tid + "[") for k in found)]
        outcomes = list(found.values()) + [TestOutcome(tid, "error", "not run") for tid in missing]
    return Grade(task.id, outcomes, out.exit_code, out.timed_out, crashed, log)


def workdir_changes(task: IssueTask, workdir: str | Path) -> list[str]:
    """Repo-relative paths of regular files in ``workdir`` that differ from, or are not in, repo/.

    Symlinks, FIFOs and the like (which sandboxed code may leave) are not files a team wrote.
    """
    workdir = Path(workdir)
    return [rel for rel in repo_files(workdir)
            if read_regular(workdir / rel) != read_regular(task.repo_dir / rel)]


def repo_files(root: str | Path) -> list[str]:
    """Relative paths of the regular files under ``root`` (links not followed, caches skipped)."""
    root = Path(root)
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(set(dirs) - _IGNORED(folder, dirs))
        for name in sorted(set(files) - _IGNORED(folder, files)):
            if is_regular(Path(folder) / name):
                found.append((Path(folder) / name).relative_to(root).as_posix())
    return found


_TEST_CONFIG = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}


def graded_path(task: IssueTask, rel: str) -> bool:
    """Whether grading takes the team's version of ``rel``: a non-test source module only.

    Left out: anything that is not ``.py``, test files and folders, pytest configuration, the
    hidden tests' folder, and new top-level modules (``pytest.py`` would shadow pytest itself).
    A new module is taken inside a package that repo/ already has.
    """
    p = Path(rel)
    if p.suffix != ".py" or p.name in _TEST_CONFIG or p.name.startswith("test_") or p.stem.endswith("_test"):
        return False
    if p.parts[0] in ("tests", "test") or p.is_relative_to(task.hidden_dest):
        return False
    if (task.repo_dir / p).is_file():
        return True
    return len(p.parts) > 1 and (task.repo_dir / p.parts[0] / "__init__.py").is_file()


def grade_work(task: IssueTask, workdir: str | Path, runner: Runner = subprocess_runner) -> Grade:
    """Grade a team's ``workdir`` so that editing tests or test config cannot game the grade.

    A fresh copy of the buggy repo gets the team's version of the files :func:`graded_path`
    accepts, then :func:`grade` runs there; the changes left out are in ``Grade.ignored``.
    """
    changes = workdir_changes(task, workdir)
    with tempfile.TemporaryDirectory(prefix=f"rolecast-grade-{task.id}-") as tmp:
        fresh = copy_repo(task, Path(tmp) / "repo")
        for rel in filter(lambda r: graded_path(task, r), changes):
            (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(workdir) / rel, fresh / rel, follow_symlinks=False)
        result = grade(task, fresh, runner)
    result.ignored = [r for r in changes if not graded_path(task, r)]
    return result


def grade(task: IssueTask, workdir: str | Path, runner: Runner = subprocess_runner) -> Grade:
    """Install the hidden tests in ``workdir``, run them (only them) and grade each one.

    A crash (collection error, timeout, internal error) counts every hidden test as failed.
    """
    workdir = Path(workdir)
    install_hidden_tests(task, workdir)
    return run_tests(task, workdir, runner, task.hidden_test_files(), task.hidden_test_ids())


# --------------------------------------------------------------------------------------- checking


@dataclass
class CheckReport:
    task_id: str
    problems: list[str] = field(default_factory=list)
    buggy: Grade | None = None  # visible + hidden tests on the buggy repo
    fixed: Grade | None = None  # visible + hidden tests with solution.patch applied

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        if self.ok:
            return f"{self.task_id}: ok"
        return f"{self.task_id}: " + "; ".join(self.problems)


def _file_of(test_id: str) -> str:
    """The file part of a test id (``tests/hidden/test_x.py`` of ``...::TestC::test_m[2]``)."""
    return test_id.split("::", 1)[0]


def check_task(task: IssueTask, runner: Runner = subprocess_runner) -> CheckReport:
    """Prove a task sound.

    On the buggy repo every visible test passes and at least one hidden test fails; with
    ``solution.patch`` applied every visible and every hidden test passes.
    """
    rep = CheckReport(task.id)
    hidden_ids = task.hidden_test_ids()
    hidden_files = task.hidden_test_files()
    if not hidden_ids:
        rep.problems.append("no hidden test functions found")
        return rep
    with tempfile.TemporaryDirectory(prefix=f"rolecast-check-{task.id}-") as tmp:
        for label in ("buggy", "fixed"):
            work = copy_repo(task, Path(tmp) / label)
            if label == "fixed":
                ok, msg = apply_patch(work, task.solution_patch())
                if not ok:
                    rep.problems.append(f"solution.patch does not apply: {msg}")
                    return rep
            install_hidden_tests(task, work)
            visible = list(task.visible_tests)
            g = run_tests(task, work, runner, visible + hidden_files, hidden_ids)
            setattr(rep, label, g)
            # by file: pytest's ids of parametrized cases are not the static ids
            hidden = [o for o in g.outcomes if _file_of(o.id) in hidden_files]
            vis = [o for o in g.outcomes if _file_of(o.id) not in hidden_files]
            if g.crashed:
                rep.problems.append(f"{label}: test run crashed (exit {g.exit_code}): "
                                    + " ".join(g.log.split())[-300:])
                continue
            if not vis:
                rep.problems.append(f"{label}: no visible tests ran")
            bad_vis = [o.id for o in vis if not o.ok]
            if bad_vis:
                rep.problems.append(f"{label}: visible tests fail: {', '.join(bad_vis)}")
            if label == "buggy":
                if all(o.ok for o in hidden):
                    rep.problems.append("buggy: every hidden test passes (the bug is not caught)")
            else:
                bad = [f"{o.id} ({o.message})" if o.message else o.id for o in hidden if not o.ok]
                if bad:
                    rep.problems.append(f"fixed: hidden tests fail: {', '.join(bad)}")
    return rep
