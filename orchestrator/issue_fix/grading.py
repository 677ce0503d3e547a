"""Grading: hidden tests copied into a team's work and run, one outcome per test as pytest names it
(each case of a parametrized test is one); the reward is the fraction that passed. Every command
goes through a runner (``running.py``) so that a sandbox can be plugged in.
"""
from __future__ import annotations

import os
import select
import shlex
import shutil
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from sandboxes.pool import remove_tree, temporary_dir

from .edits import is_regular, read_regular
from .running import RunOutcome, Runner, copy_repo, subprocess_runner
from .task import IGNORED, REPORT_FILE, IssueTask

# a junit report is read whole (cut short it would not parse): many tests' failure texts, not source
REPORT_BYTES = 64_000_000


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
    crashed: bool = False  # collection error, internal error, timeout, no report or one the exit code belies
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
    remove_tree(dest)  # a link or a file there too, and however deep
    shutil.copytree(task.hidden_dir, dest, ignore=IGNORED)
    return dest


def _pytest_argv(task: IssueTask, paths: list[str]) -> list[str]:
    # a path is a file even where it begins with "-" (the Tester's -regression.py was the option -r)
    paths = [f"./{p}" if p.startswith("-") else p for p in paths]  # pytest names it without the ./
    return shlex.split(task.test_command) + paths + [
        f"--junitxml={REPORT_FILE}", "-o", "junit_family=xunit1", "-rA", "-p", "no:cacheprovider",
    ]


def _parse_junit(text: str) -> dict[str, TestOutcome]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return {}  # no outcomes: a crash
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


def run_tests(task: IssueTask, workdir: Path, runner: Runner, paths: list[str],
               expected: list[str]) -> Grade:
    """Run pytest on ``paths``: one outcome per test id pytest reports (``file::name[params]``).

    ``expected`` holds static ids (``file::name``, see :meth:`IssueTask.hidden_test_ids`): one
    that no reported id matches counts as an error ("not run"); a crash makes each an error and
    drops whatever was reported.
    """
    report = workdir / REPORT_FILE
    remove_tree(report)  # whatever a run before left there: a folder made unlink raise
    out, data = _reading_report(report, lambda: runner(_pytest_argv(task, paths), workdir, task.timeout_s))
    remove_tree(report)
    log = (out.stdout + "\n" + out.stderr)[-4000:]
    found = _parse_junit(data.decode("utf-8", errors="replace"))
    # No report (or none that parses) is a crash, not a cue to read pytest's -rA lines on stdout:
    # code under test can print "PASSED ..." there, past pytest's capture, and exit before it.
    # exit 0: all passed, 1: some failed, as the report must say too (code under test that
    # writes its own over pytest's at exit leaves pytest's 1); anything else (2 interrupted/
    # collection error, 3 internal error, 4 usage error, 5 nothing collected) or a timeout: a crash.
    failing = any(o.status in ("failed", "error") for o in found.values())
    crashed = out.timed_out or out.exit_code != int(failing) or not found
    if crashed:
        why = "timed out" if out.timed_out else f"test run crashed (exit {out.exit_code})"
        outcomes = [TestOutcome(tid, "error", why) for tid in expected]
    else:
        missing = [tid for tid in expected if not any(is_case(k, tid) for k in found)]
        outcomes = list(found.values()) + [TestOutcome(tid, "error", "not run") for tid in missing]
    return Grade(task.id, outcomes, out.exit_code, out.timed_out, crashed, log)


def _reading_report(path: Path, run: Callable[[], RunOutcome]) -> tuple[RunOutcome, bytes]:
    """``run()``, and what it wrote to ``path``: a FIFO that this process drains as it is written.

    Not a file: code under test, in pytest's process, could write one over pytest's at exit.
    What it writes to the FIFO, before or after pytest, joins pytest's report, which then does
    not parse; unlinking or replacing the FIFO leaves no report. Either way: a crash.
    """
    os.mkfifo(path, 0o600)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    ours = os.open(path, os.O_WRONLY)  # held open for the run: no end of file before a writer comes
    os.chmod(path, 0o200)  # write-only: code that reads every file it finds fails, not waits for the run's end
    chunks: list[bytes] = []
    done = threading.Event()
    poll = select.poll()
    poll.register(fd, select.POLLIN)

    size = 0

    def take() -> bool:
        """Keep what the FIFO holds now (up to REPORT_BYTES in all); False once every writer closed."""
        nonlocal size
        chunk = os.read(fd, 1 << 16)
        size += len(chunk)
        if size <= REPORT_BYTES:
            chunks.append(chunk)
        return bool(chunk)

    def drain() -> None:
        while not done.is_set():
            if poll.poll(100) and not take():
                return
        # The run is over, so pytest's report is read but for what the pipe still holds; that much
        # and no more: a writer the run left behind (a detached process) may write for ever.
        try:
            for _ in range(16):  # 1 MiB: a pipe holds 64 KiB unless its writer enlarged it
                if not take():
                    return
        except BlockingIOError:  # all of it read
            return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out = run()
    finally:
        os.close(ours)
        done.set()
        reader.join()
        os.close(fd)
    return out, b"".join(chunks)


def is_case(reported: str, tid: str) -> bool:
    """Whether pytest's id ``reported`` is static id ``tid`` or one of its parametrized cases."""
    return reported == tid or reported.startswith(tid + "[")


def workdir_changes(task: IssueTask, workdir: str | Path) -> list[str]:
    """Repo-relative paths of regular files in ``workdir`` that differ from, or are not in, repo/.

    Symlinks, FIFOs and the like (which sandboxed code may leave) are not files a team wrote.
    """
    workdir = Path(workdir)
    return [rel for rel in repo_files(workdir)
            if read_regular(workdir / rel) != read_regular(task.repo_dir / rel)]


def repo_files(root: str | Path) -> list[str]:
    """Relative paths of the regular files under ``root`` (links not followed, caches skipped).

    Names that are not UTF-8 (sandboxed code can make them) are skipped: no module is named so,
    and no prompt or transcript can hold them.
    """
    root = Path(root)
    found: list[str] = []
    stack = [root]  # not os.walk: that recurses (Python 3.11), and sandboxed code nests folders at will
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = {e.name: e for e in it}
        except OSError:  # as os.walk: a folder that cannot be listed is skipped
            continue
        names = sorted(filter(_utf8, set(entries) - IGNORED(folder, entries)))
        found += [(folder / n).relative_to(root).as_posix() for n in names if is_regular(folder / n)]
        stack += [folder / n for n in reversed(names) if entries[n].is_dir(follow_symlinks=False)]
    return found


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")  # os.walk gives a byte it cannot decode as a lone surrogate
    except UnicodeEncodeError:
        return False
    return True


_TEST_CONFIG = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}


def graded_path(task: IssueTask, rel: str) -> bool:
    """Whether grading takes the team's version of ``rel``: a non-test source module only.

    Left out: anything that is not ``.py``, test files and folders, pytest configuration, the
    hidden tests' folder, and new top-level modules (``pytest.py`` would shadow pytest itself).
    A new module is taken inside a package that repo/ already has, and not under one of its
    files (sandboxed code can turn ``pkg/mod.py`` into a folder: the copy could not hold it).
    """
    p = Path(rel)
    if p.suffix != ".py" or p.name in _TEST_CONFIG or p.name.startswith("test_") or p.stem.endswith("_test"):
        return False
    if p.parts[0] in ("tests", "test") or p.is_relative_to(task.hidden_dest):
        return False
    if (task.repo_dir / p).is_file():
        return True
    return (len(p.parts) > 1 and (task.repo_dir / p.parts[0] / "__init__.py").is_file()
            and not any((task.repo_dir / q).is_file() for q in p.parents))


def grade_work(task: IssueTask, workdir: str | Path, runner: Runner = subprocess_runner) -> Grade:
    """Grade a team's ``workdir`` so that editing tests or test config cannot game the grade.

    A fresh copy of the buggy repo gets the team's version of the files :func:`graded_path`
    accepts, then :func:`grade` runs there; the changes left out are in ``Grade.ignored``.
    """
    changes = workdir_changes(task, workdir)
    with temporary_dir(prefix=f"rolecast-grade-{task.id}-") as tmp:
        fresh = copy_repo(task, Path(tmp) / "repo")
        for rel in filter(lambda r: graded_path(task, r), changes):
            (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(workdir) / rel, fresh / rel, follow_symlinks=False)
        result = grade(task, fresh, runner)
    result.ignored = [r for r in changes if not graded_path(task, r)]
    return result


def grade(task: IssueTask, workdir: str | Path, runner: Runner = subprocess_runner) -> Grade:
    """Install the hidden tests in ``workdir``, run them (only them) and grade each one.

    A crash (collection error, timeout, internal error) counts every hidden test as failed; a
    reported test that is not one of them (nor one of its parametrized cases) does not count.
    """
    workdir = Path(workdir)
    install_hidden_tests(task, workdir)
    ids = task.hidden_test_ids()
    result = run_tests(task, workdir, runner, task.hidden_test_files(), ids)
    # only hidden tests count: code under test can add made-up ids to the report (each a pass)
    result.outcomes = [o for o in result.outcomes if any(is_case(o.id, tid) for tid in ids)]
    return result
