"""An issue-fixing task: its folder, its task.yaml, and loading both.

A task is a folder ``tasks/<id>/``::

    task.yaml        id, title, kind, issue, test_command, visible_tests, hidden_tests, ...
    repo/            the project with the bug (what the team sees and edits)
    hidden_tests/    tests copied into the repo at grading time only
    solution.patch   a unified diff against repo/ (paths a/... b/...) that fixes the bug
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
from pathlib import Path

from pydantic import ConfigDict, Field, field_validator

from ..config import NoBoolNumbers
from ..errors import ConfigError
from ..config_errors import validate_model
from ..yamlfile import load_yaml

TASK_FILE = "task.yaml"
PATCH_FILE = "solution.patch"
REPORT_FILE = ".rolecast-grade.xml"  # junit report, written inside the workdir
_ID_RE = re.compile(r"^[a-z0-9]+([-_][a-z0-9]+)*$")
HIDDEN_TEST_FILES = ("test_*.py", "*_test.py")  # pytest's own python_files: each one it would collect
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", REPORT_FILE)  # never copied


class TaskFileError(ConfigError, ValueError):
    """A bad task folder: one line ``FILE:LINE: KEY: problem``; a ValueError too, for older callers."""


class IssueTask(NoBoolNumbers):
    # timeout_s finite: `.inf` loaded, then each test run raised ValueError from sandboxes.Limits
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
        return p.as_posix()  # as pytest names it: "tests/hidden/" made every hidden test "not run"

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
        """Repo-relative paths of the files ``solution.patch`` changes, adds or deletes (a deleted
        one's name is on its ``---`` line; a name up to a tab: GNU diff's date and git's mark of a
        name with spaces follow one)."""
        return sorted(set(re.findall(r"^(?:---|\+\+\+) [ab]/([^\t\n]+)", self.solution_patch(), re.M)))

    def hidden_test_files(self) -> list[str]:
        """Hidden test files as paths relative to the repo root once installed."""
        return sorted({
            f"{self.hidden_dest}/{p.relative_to(self.hidden_dir).as_posix()}"
            for pattern in HIDDEN_TEST_FILES for p in self.hidden_dir.rglob(pattern)
        })

    def hidden_test_ids(self) -> list[str]:
        """``file::name`` of every hidden test, read statically (functions and Test* methods)."""
        ids: list[str] = []
        for rel in self.hidden_test_files():
            src = self.hidden_dir / Path(rel).relative_to(self.hidden_dest)
            try:
                names = static_test_names(src.read_text(encoding="utf-8"))
            except SyntaxError as exc:
                raise TaskFileError(src, exc.lineno, "(file)", f"hidden test does not parse: {exc.msg}") from None
            except UnicodeDecodeError as exc:
                raise TaskFileError(src, None, "(file)", f"hidden test is not UTF-8 text: {exc}") from None
            except OSError as exc:  # a dangling link, a folder named test_*.py
                raise TaskFileError(src, None, "(file)", f"hidden test is unreadable: {exc.strerror or exc}") from None
            ids += [f"{rel}::{n}" for n in names]
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
    name = Path(os.path.abspath(folder)).name  # `.` or `repo/..` names the folder too (its link's name, not its target's)
    if task.id != name:
        raise doc.error(("id",), f"{task.id!r} does not match the folder name {name!r}")
    if not task.repo_dir.is_dir():
        raise ConfigError(doc.path, None, "(folder)", f"no repo/ folder next to {TASK_FILE}")
    if Path(task.hidden_tests).parts[0] == "repo":  # the team reads and runs repo/: graded on tests it was shown
        raise doc.error(("hidden_tests",), f"{task.hidden_tests!r} is inside repo/, which the team sees; "
                                           "keep the hidden tests in a folder beside it")
    if not task.hidden_dir.is_dir():
        raise doc.error(("hidden_tests",), f"folder {task.hidden_tests!r} not found")
    if not task.hidden_test_files():
        raise doc.error(("hidden_tests",), f"no {' or '.join(HIDDEN_TEST_FILES)} files in {task.hidden_tests!r}")
    task.hidden_test_ids()  # grading reads them: one that does not parse is this task's error, not an episode's
    try:  # the fix: rewards and `rolecast tasks check` apply it
        task.solution_patch()
    except FileNotFoundError:
        raise ConfigError(doc.path, None, "(folder)", f"no {PATCH_FILE} next to {TASK_FILE} (the fix, as a diff)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(task.patch_path, None, "(file)", f"unreadable: {exc}") from None
    for i, rel in enumerate(task.visible_tests):
        if Path(rel).is_absolute() or ".." in Path(rel).parts:  # it existed, and every team test run crashed
            raise doc.error(("visible_tests", i), f"{rel!r} must be a relative path inside repo/")
        if not (task.repo_dir / rel).exists():
            raise doc.error(("visible_tests", i), f"{rel!r} not found in repo/")
    try:
        shlex.split(task.test_command)
    except ValueError as exc:
        raise doc.error(("test_command",), f"cannot be split: {exc}") from None
    return task


def task_folders(root: str | Path) -> list[Path]:
    """The task folders (those holding task.yaml) right under ``root``, sorted by name."""
    return sorted(p.parent for p in Path(root).glob(f"*/{TASK_FILE}"))
