"""The issue-fixing task suite (tasks/) and its loader/grader (orchestrator/issue_fix/)."""
from __future__ import annotations

import difflib
import re
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.issue_fix.checking import check_task
from orchestrator.issue_fix.grading import grade, grade_work
from orchestrator.issue_fix.running import RunOutcome, apply_patch, copy_repo, sandbox_runner, subprocess_runner
from orchestrator.issue_fix.task import IssueTask, TaskFileError, load_task, static_test_names, task_folders
from support import needs_sandbox

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"
TASK_DIRS = sorted(p.parent for p in TASKS_DIR.glob("*/task.yaml"))


def _task(task_id: str) -> IssueTask:
    return load_task(TASKS_DIR / task_id)


# ------------------------------------------------------------------------------ the suite


def test_suite_size_and_ids():
    tasks = [load_task(f) for f in task_folders(TASKS_DIR)]
    assert len(tasks) >= 40
    ids = [t.id for t in tasks]
    assert len(set(ids)) == len(ids)
    numbers = [t.id[:3] for t in tasks]
    assert len(set(numbers)) == len(numbers), "task numbers must be unique"
    assert all(t.kind for t in tasks), "every task says what kind of bug it is"
    multi = [t for t in tasks if "multi-file" in t.kind]
    assert len(multi) >= 3
    for t in multi:
        touched = re.findall(r"^\+\+\+ b/(\S+)", t.solution_patch(), re.M)
        assert len(set(touched)) >= 2, f"{t.id}: a multi-file fix must touch 2 files"


def test_the_module_every_test_command_runs_is_installed_with_rolecast():
    """pytest was only in the dev extra: after a plain ``pip install rolecast`` every task
    checked FAIL and every issue_fix episode graded as a crash, ``No module named pytest``."""
    pyproject = tomllib.loads((TASKS_DIR.parent / "pyproject.toml").read_text(encoding="utf-8"))
    declared = {re.match(r"[\w.-]+", d).group() for d in pyproject["project"]["dependencies"]}
    for task in map(load_task, task_folders(TASKS_DIR)):
        argv = shlex.split(task.test_command)
        assert argv[:2] == ["python", "-m"] and argv[2] in declared, f"{task.id}: {task.test_command}"


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=[p.name for p in TASK_DIRS])
def test_task_is_sound(task_dir: Path):
    task = load_task(task_dir)
    assert 3 <= len(task.hidden_test_ids()) <= 6, "3-6 hidden tests per task"
    report = check_task(task, subprocess_runner)
    assert report.ok, str(report)
    assert not list(task_dir.rglob("__pycache__")), "checking must not write into tasks/"


# ------------------------------------------------------------------------------ loading


def _write_task(tmp_path: Path, text: str, name: str = "001-demo") -> Path:
    src = TASKS_DIR / "002-paginate-last-page"
    dest = tmp_path / name
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "task.yaml").write_text(text, encoding="utf-8")
    return dest


GOOD = (
    "id: 001-demo\ntitle: t\nissue: something breaks\ntest_command: python -m pytest -q\n"
    "visible_tests: [tests]\nhidden_tests: hidden_tests\n"
)


@needs_sandbox
def test_a_test_command_of_pytest_alone_runs_the_interpreters_pytest(tmp_path):
    """`test_command: pytest -q`, as a task author writes it: the sandbox found no `pytest` (exit 127)."""
    task = load_task(_write_task(tmp_path, GOOD.replace("python -m pytest -q", "pytest -q")))
    report = check_task(task, sandbox_runner())
    assert report.ok, report.problems


def test_load_good(tmp_path):
    task = load_task(_write_task(tmp_path, GOOD))
    assert task.id == "001-demo" and task.hidden_dest == "tests/hidden"
    assert task.path == tmp_path / "001-demo"


def test_the_files_a_fix_touches_include_deleted_ones_and_names_with_spaces(tmp_path):
    """The Planner is paid for naming them: a file the fix deletes, and a name with a space, had
    been left out (only `+++ b/` lines were read, up to the first space)."""
    folder = _write_task(tmp_path, GOOD)
    (folder / "solution.patch").write_text(
        "--- a/pager/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n"
        "--- a/pager/my notes.py\t\n+++ b/pager/my notes.py\t\n@@ -1 +1 @@\n-a\n+b\n"
        "--- /dev/null\n+++ b/pager/new.py\t2026-01-01 00:00:00\n@@ -0,0 +1 @@\n+y = 2\n")
    assert load_task(folder).solution_files() == ["pager/my notes.py", "pager/new.py", "pager/old.py"]


@pytest.mark.parametrize(
    "text, line, key, problem",
    [
        (GOOD + "colour: red\n", 7, "colour", "unknown key"),
        (GOOD.replace("test_command: python -m pytest -q\n", ""), 1, "test_command", "required key is missing"),
        (GOOD.replace("id: 001-demo", "id: 001-other"), 1, "id", "does not match the folder name"),
        (GOOD.replace("[tests]", "[nope.py]"), 5, "visible_tests[0]", "not found in repo/"),
        (GOOD.replace("[tests]", "[tests, ../task.yaml]"), 5, "visible_tests[1]", "relative path inside repo/"),
        (GOOD.replace("[tests]", "[/etc/hostname]"), 5, "visible_tests[0]", "relative path inside repo/"),
        (GOOD.replace("title: t", "title: [1, 2]"), 2, "title", "valid string"),
        (GOOD + "path: /x\n", 7, "path", "unknown key"),
        (GOOD + "timeout_s: .inf\n", 7, "timeout_s", "finite number"),
        (GOOD + "timeout_s: yes\n", 7, "timeout_s", "must be a number, not a boolean"),
        ("id: [unclosed\n", 2, "(yaml)", "invalid YAML"),
        (GOOD.replace("title: t", "title: '  '"), 2, "title", "must not be empty"),
        (GOOD.replace("[tests]", "[]"), 5, "visible_tests", "at least 1 item"),
        (GOOD + "hidden_dest: /tmp/hidden\n", 7, "hidden_dest", "relative path inside the task"),
        (GOOD + "hidden_dest: tests/../../x\n", 7, "hidden_dest", "relative path inside the task"),
        (GOOD + "timeout_s: 0\n", 7, "timeout_s", "greater than 0"),
        (GOOD.replace("hidden_tests: hidden_tests", "hidden_tests: nope"), 6, "hidden_tests", "folder 'nope' not found"),
        (GOOD.replace("hidden_tests: hidden_tests", "hidden_tests: empty"), 6, "hidden_tests", "no test_*.py or *_test.py files in 'empty'"),
        # the repo's own tests as the hidden ones: loaded, and graded on tests the team had run
        (GOOD.replace("hidden_tests: hidden_tests", "hidden_tests: repo"), 6, "hidden_tests", "'repo' is inside repo/"),
        (GOOD.replace("hidden_tests: hidden_tests", "hidden_tests: ./repo/tests"), 6, "hidden_tests", "'repo/tests' is inside repo/"),
        (GOOD.replace("-m pytest -q", "-m pytest -k 'a"), 4, "test_command", "cannot be split"),
    ],
)
def test_bad_task_yaml_one_line_error(tmp_path, text, line, key, problem):
    folder = _write_task(tmp_path, text)
    (folder / "empty").mkdir()
    with pytest.raises(ValueError) as info:
        load_task(folder)
    msg = str(info.value)
    assert isinstance(info.value, TaskFileError) and isinstance(info.value, ConfigError)
    assert "\n" not in msg
    assert msg.startswith(f"{folder / 'task.yaml'}:{line}: {key}: "), msg
    assert problem in msg


def test_a_task_without_its_repo_is_one_line(tmp_path):
    folder = _write_task(tmp_path, GOOD)
    shutil.rmtree(folder / "repo")
    with pytest.raises(TaskFileError, match=r"task\.yaml: \(folder\): no repo/ folder next to task\.yaml$"):
        load_task(folder)


def test_hidden_test_names_are_those_pytest_collects():
    source = ("def testit(): pass\ndef test_x(): pass\ndef helper(): pass\n"
              "class TestA:\n    def testm(self): pass\n    def other(self): pass\nclass Helper:\n    def test_z(self): pass\n"
              # collected too (and failed, with no async plugin): left out, they ran but never counted
              "async def test_co(): pass\nclass TestB:\n    async def test_m(self): pass\n")
    assert static_test_names(source) == ["testit", "test_x", "TestA::testm", "test_co", "TestB::test_m"]


@pytest.mark.parametrize("patch, problem", [(None, "task.yaml: (folder): no solution.patch next to task.yaml"),
                                            (b"\xff\xfe--- a/x\n", "solution.patch: (file): unreadable: 'utf-8' codec")])
def test_a_task_without_a_readable_fix_is_one_line(tmp_path, patch, problem):
    folder = _write_task(tmp_path, GOOD)
    (folder / "solution.patch").unlink()
    if patch is not None:
        (folder / "solution.patch").write_bytes(patch)
    with pytest.raises(TaskFileError) as info:
        load_task(folder)
    assert str(info.value).startswith(str(folder)) and problem in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("tail, line, problem", [(b"def test_x(:\n", ":", "does not parse: invalid syntax"),
                                                 (b"# \xff\n", ": ", "not UTF-8 text")])
def test_a_hidden_test_that_cannot_be_read_is_one_line(tmp_path, tail, line, problem):
    """Grading reads the hidden tests' names: loading let this through, every episode then failed."""
    folder = _write_task(tmp_path, GOOD)
    hidden = folder / "hidden_tests/test_hidden_paginate.py"
    hidden.write_bytes(hidden.read_bytes() + tail)
    with pytest.raises(TaskFileError) as info:
        load_task(folder)
    assert str(info.value).startswith(f"{hidden}{line}") and problem in str(info.value), str(info.value)


@pytest.mark.parametrize("make", [lambda p: p.symlink_to(p.parent / "gone.py"), lambda p: p.mkdir()])
def test_a_hidden_test_that_is_not_a_file_is_one_line(tmp_path, make):
    """A dangling link or a folder named test_*.py: loading (and `rolecast tasks check`) raised a traceback."""
    folder = _write_task(tmp_path, GOOD)
    make(folder / "hidden_tests/test_extra.py")
    with pytest.raises(TaskFileError) as info:
        load_task(folder)
    msg = str(info.value)
    assert msg.startswith(f"{folder / 'hidden_tests/test_extra.py'}: (file): hidden test is unreadable") and "\n" not in msg


def test_a_task_named_from_inside_its_folder_loads(tmp_path, monkeypatch):
    """`rolecast tasks check .` in a task folder: its name was '' and the id never matched it."""
    folder = _write_task(tmp_path, GOOD)
    monkeypatch.chdir(folder / "repo")
    assert load_task("..").id == "001-demo"
    monkeypatch.chdir(folder)
    assert load_task(".").id == "001-demo" and load_task("repo/..").id == "001-demo"
    (folder / "task.yaml").write_text(GOOD.replace("id: 001-demo", "id: 001-other"), encoding="utf-8")
    with pytest.raises(TaskFileError, match="'001-other' does not match the folder name '001-demo'"):
        load_task(".")


def test_hidden_tests_named_as_pytest_allows_are_graded(tmp_path):
    """pytest collects *_test.py as it does test_*.py: a hidden paginate_test.py was copied in but
    never run, so a task with only such files did not load, and one beside a test_*.py was not graded."""
    folder = _write_task(tmp_path, GOOD)
    hidden = folder / "hidden_tests"
    (hidden / "test_hidden_paginate.py").rename(hidden / "hidden_paginate_test.py")
    task = load_task(folder)
    assert task.hidden_test_files() == ["tests/hidden/hidden_paginate_test.py"]
    assert grade(task, copy_repo(task, tmp_path / "work")).total == 5
    assert check_task(task, subprocess_runner).ok


@pytest.mark.parametrize("dest", ["tests/hidden/", "./tests//hidden"])
def test_hidden_dest_is_taken_as_pytest_names_it(tmp_path, dest):
    """Written with a trailing slash, the hidden tests' ids were tests/hidden//test_x.py::...,
    which pytest's never matched: the reference fix graded 0 of 5, every test "not run"."""
    task = load_task(_write_task(tmp_path, GOOD + f"hidden_dest: {dest}\n"))
    assert task.hidden_dest == "tests/hidden"
    work = copy_repo(task, tmp_path / "work")
    assert apply_patch(work, task.solution_patch())[0]
    assert grade(task, work).fraction == 1.0


def test_bad_task_id_shape(tmp_path):
    folder = _write_task(tmp_path, GOOD.replace("001-demo", "Demo_1"), name="Demo_1")
    with pytest.raises(ValueError, match=r"task\.yaml:1: id: must be a lowercase slug"):
        load_task(folder)


@pytest.mark.parametrize("task_id", ["my-task", "fix_parser2", "parser"])
def test_task_id_without_a_number_prefix_loads(tmp_path, task_id):
    assert load_task(_write_task(tmp_path, GOOD.replace("001-demo", task_id), name=task_id)).id == task_id


# ------------------------------------------------------------------------------ patches & grading


def _diff(workdir: Path, rel: str, old: str, new: str) -> str:
    text = (workdir / rel).read_text(encoding="utf-8")
    assert old in text
    after = text.replace(old, new, 1)
    return "".join(difflib.unified_diff(
        text.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"))


def test_reference_patch_grades_one(tmp_path):
    task = _task("002-paginate-last-page")
    work = copy_repo(task, tmp_path / "work")
    before = grade(task, work)
    assert before.total == len(task.hidden_test_ids()) == 5
    assert 0 < before.fraction < 1  # graded, not binary
    ok, msg = apply_patch(work, task.solution_patch())
    assert ok, msg
    after = grade(task, work)
    assert (after.passed, after.total, after.fraction) == (5, 5, 1.0)
    assert all(o.id.startswith("tests/hidden/") for o in after.outcomes)


def test_wrong_patch_grades_below_one(tmp_path):
    task = _task("002-paginate-last-page")
    work = copy_repo(task, tmp_path / "work")
    unrelated = _diff(work, "pager/paginate.py", "return number < self.num_pages",
                      "return self.num_pages > number")
    ok, msg = apply_patch(work, unrelated)
    assert ok, msg
    g = grade(task, work)
    assert g.fraction < 1.0 and g.failed_ids


def test_half_of_a_multi_file_fix_grades_below_one(tmp_path):
    task = _task("039-cli-sep-option")
    patch = task.solution_patch()
    cli_only = patch[patch.index("diff -ruN a/rowexport/cli.py"):patch.index("diff -ruN a/rowexport/render.py")]
    work = copy_repo(task, tmp_path / "work")
    ok, msg = apply_patch(work, cli_only)
    assert ok, msg
    assert grade(task, work).fraction < 1.0


def test_apply_patch_that_does_not_apply(tmp_path):
    task = _task("001-slugify-unicode")
    work = copy_repo(task, tmp_path / "work")
    bad = ("--- a/textkit/slug.py\n+++ b/textkit/slug.py\n@@ -1,3 +1,3 @@\n"
           "-this line is not there\n+replacement\n context\n context2\n")
    ok, msg = apply_patch(work, bad)
    assert ok is False and msg
    assert apply_patch(work, "") == (False, "empty patch")
    ok, msg = apply_patch(work, "not a diff at all\n")
    assert ok is False and msg
    # nothing changed
    assert (work / "textkit/slug.py").read_text() == (task.repo_dir / "textkit/slug.py").read_text()


def test_a_patch_in_utf8_applies_whatever_the_locale(tmp_path):
    """Under LC_ALL=C (PYTHONUTF8=0) the patch went to git encoded in the locale's ASCII: an é
    in it was a UnicodeEncodeError out of apply_patch (which never raises), and out of the
    Tester's reward with it; a Latin-1 locale wrote it as Latin-1, a patch that no longer applies."""
    (tmp_path / "a.py").write_bytes(b"x = 'caf'\n")
    patch = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 'caf'\n+x = 'caf\u00e9 \U0001f600'\n"
    code = f"from orchestrator.issue_fix.running import apply_patch; print(apply_patch({str(tmp_path)!r}, {ascii(patch)}))"
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=TASKS_DIR.parent, env=env, capture_output=True, timeout=60)
    assert proc.stdout == b"(True, 'applied with git apply')\n", proc.stderr.decode()
    assert (tmp_path / "a.py").read_text(encoding="utf-8") == "x = 'caf\u00e9 \U0001f600'\n"


def test_output_that_is_not_utf8_is_replaced_not_a_crash(tmp_path):
    """A test printing bytes that are not UTF-8 was a UnicodeDecodeError out of subprocess_runner,
    where the sandbox's runner replaces them."""
    printer = "import sys; sys.stdout.buffer.write(b'ok \\xff\\x80\\x00 done'); sys.stderr.buffer.write(b'\\xe9')"
    out = subprocess_runner(["python", "-c", printer], tmp_path, 30)
    assert (out.exit_code, out.stdout, out.stderr) == (0, "ok \ufffd\ufffd\x00 done", "\ufffd")


def test_a_patch_without_a_last_newline_applies_with_git_or_patch(tmp_path, monkeypatch):
    """Where git is missing, ``patch -p1`` applies the same patches and refuses the same ones."""
    fix = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2"  # git: "corrupt patch" without its newline
    evil = "--- a/../evil.txt\n+++ b/../evil.txt\n@@ -0,0 +1 @@\n+x\n"
    found = shutil.which
    for tool, which in [("git apply", found), ("patch -p1", lambda name: None if name == "git" else found(name))]:
        monkeypatch.setattr(shutil, "which", which)
        work = tmp_path / tool
        work.mkdir()
        (work / "a.py").write_text("x = 1\n")
        half = fix + "\n--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-y = 1\n+y = 2\n"  # its second file is not there
        assert apply_patch(work, half)[0] is False and (work / "a.py").read_text() == "x = 1\n"
        assert apply_patch(work, evil)[0] is False and not (tmp_path / "evil.txt").exists()
        assert apply_patch(work, fix) == (True, f"applied with {tool}") and (work / "a.py").read_text() == "x = 2\n"
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert apply_patch(tmp_path / "git apply", fix) == (False, "neither git nor patch is installed")


def test_the_local_runner_runs_our_python_in_the_test_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the caller's: a module there would shadow the repo's
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    show = "import os, sys; print(sys.executable, os.environ.get('PYTHONDONTWRITEBYTECODE'), os.environ.get('PYTHONPATH'))"
    assert subprocess_runner(["python3", "-c", show], tmp_path, 30).stdout.split() == [sys.executable, "1", "None"]
    slow = subprocess_runner(["python", "-c", "import time; time.sleep(5)"], tmp_path, 0.5)
    assert (slow.exit_code, slow.timed_out) == (124, True)
    missing = subprocess_runner(["no-such-program"], tmp_path, 5)
    assert missing.exit_code == 127 and "cannot run 'no-such-program'" in missing.stderr


def test_a_repo_is_copied_only_where_nothing_is(tmp_path):
    task = _task("001-slugify-unicode")
    (tmp_path / "empty").mkdir()
    assert (copy_repo(task, tmp_path / "empty") / "textkit/slug.py").is_file()
    with pytest.raises(FileExistsError, match="not empty"):
        copy_repo(task, tmp_path / "empty")


def test_patch_outside_workdir_refused(tmp_path):
    task = _task("001-slugify-unicode")
    work = copy_repo(task, tmp_path / "work")
    evil = "--- a/../evil.txt\n+++ b/../evil.txt\n@@ -0,0 +1 @@\n+x\n"
    ok, _ = apply_patch(work, evil)
    assert ok is False and not (tmp_path / "evil.txt").exists()


def test_crash_counts_every_hidden_test_failed(tmp_path):
    task = _task("014-median-even-length")
    work = copy_repo(task, tmp_path / "work")
    (work / "numbox/stats.py").write_text("def broken(:\n")
    g = grade(task, work)
    assert g.crashed and g.passed == 0 and g.total == len(task.hidden_test_ids())


def test_timeout_counts_every_hidden_test_failed(tmp_path):
    task = _task("014-median-even-length")
    work = copy_repo(task, tmp_path / "work")

    def slow_runner(argv, workdir, timeout_s):
        return RunOutcome(124, "", "", timed_out=True)

    g = grade(task, work, slow_runner)
    assert g.timed_out and g.fraction == 0.0 and g.total == 5


def test_a_run_without_a_report_is_a_crash_whatever_stdout_says(tmp_path):
    """Without the junit report grading read pytest's -rA lines from stdout, which code under test
    can print (past pytest's capture, to the fd it saved) before it exits 0: all 5 passed."""
    task = _task("002-paginate-last-page")
    work = copy_repo(task, tmp_path / "work")
    seen = {}

    def forging_runner(argv, workdir, timeout_s):
        seen["argv"] = argv
        return RunOutcome(0, "".join(f"PASSED {tid}\n" for tid in task.hidden_test_ids()), "")

    g = grade(task, work, forging_runner)
    assert seen["argv"][0] == "python"  # the runner decides which interpreter
    assert g.crashed and g.total == 5 and g.passed == 0


# ------------------------------------------------------------------------------ parametrized & class-based hidden tests

CASES_TEST = '''
import pytest
from numerals.roman import from_roman, to_roman


@pytest.mark.parametrize("n, s", [(4, "IV"), (8, "VIII"), (90, "XC"), (2023, "MMXXIII")])
def test_from_roman(n, s):
    assert from_roman(s) == n


class TestRoundTrip:
    def test_additive(self):
        assert from_roman(to_roman(3)) == 3

    @pytest.mark.parametrize("n", [9, 12])
    def test_number(self, n):
        assert from_roman(to_roman(n)) == n

    @pytest.mark.parametrize("s", ["xiv", " xv "])
    def test_case_and_spaces(self, s):
        assert from_roman(s) in (14, 15)
'''
CASES_FILE = "tests/hidden/test_hidden_cases.py"
# on the buggy code: the subtractive numerals fail, the additive ones pass
BUGGY_FAILS = {f"{CASES_FILE}::{name}" for name in (
    "test_from_roman[4-IV]", "test_from_roman[90-XC]", "TestRoundTrip::test_number[9]",
    "TestRoundTrip::test_case_and_spaces[xiv]")}
CASE_IDS = BUGGY_FAILS | {f"{CASES_FILE}::{name}" for name in (
    "test_from_roman[8-VIII]", "test_from_roman[2023-MMXXIII]", "TestRoundTrip::test_additive",
    "TestRoundTrip::test_number[12]", "TestRoundTrip::test_case_and_spaces[ xv ]")}


@pytest.fixture
def cases_task(tmp_path) -> IssueTask:
    """036-roman-subtractive with parametrized and class-based hidden tests, and an id without a number."""
    folder = tmp_path / "roman-cases"
    shutil.copytree(TASKS_DIR / "036-roman-subtractive", folder, ignore=shutil.ignore_patterns("__pycache__"))
    text = (folder / "task.yaml").read_text().replace("id: 036-roman-subtractive", "id: roman-cases")
    (folder / "task.yaml").write_text(text)
    shutil.rmtree(folder / "hidden_tests")
    (folder / "hidden_tests").mkdir()
    (folder / "hidden_tests" / "test_hidden_cases.py").write_text(CASES_TEST)
    return load_task(folder)


def test_checker_finds_parametrized_and_class_hidden_tests_sound(cases_task):
    report = check_task(cases_task, subprocess_runner)
    assert report.ok, str(report)
    hidden = {o.id: o.ok for o in report.buggy.outcomes if o.id.startswith("tests/hidden/")}
    assert hidden == {tid: tid not in BUGGY_FAILS for tid in CASE_IDS}
    assert all(o.ok for o in report.fixed.outcomes)


def test_checker_still_fails_an_unsound_task_with_parametrized_tests(cases_task):
    (cases_task.repo_dir / "tests" / "test_roman.py").write_text(
        "def test_visible_breaks():\n    assert False\n\n\ndef test_visible_errors(no_such_fixture):\n    pass\n")
    report = check_task(cases_task, subprocess_runner)
    bad = "visible tests fail: tests/test_roman.py::test_visible_breaks, tests/test_roman.py::test_visible_errors"
    assert report.problems == [f"buggy: {bad}", f"fixed: {bad}"]


def test_checker_fails_a_task_whose_visible_tests_hold_no_test(cases_task):
    (cases_task.repo_dir / "tests" / "test_roman.py").write_text("# no tests here\n")
    report = check_task(cases_task, subprocess_runner)
    assert report.problems == ["buggy: no visible tests ran", "fixed: no visible tests ran"]


def test_checker_fails_a_task_without_hidden_test_functions(cases_task, tmp_path):
    (cases_task.hidden_dir / "test_hidden_cases.py").write_text("def helper():\n    pass\n")
    assert check_task(cases_task, subprocess_runner).problems == ["no hidden test functions found"]
    # such a task still loads: graded on no test, the work earns nothing rather than all
    g = grade(cases_task, copy_repo(cases_task, tmp_path / "repo"), subprocess_runner)
    assert (g.total, g.fraction) == (0, 0.0)


def test_checker_stops_at_a_fix_that_does_not_apply(cases_task):
    cases_task.patch_path.write_text("--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n")
    (problem,) = check_task(cases_task, subprocess_runner).problems  # not also its tests run without the fix
    assert problem.startswith("solution.patch does not apply: ")


def test_checker_fails_a_task_whose_hidden_tests_pass_on_the_bug(cases_task):
    (cases_task.hidden_dir / "test_hidden_cases.py").write_text("def test_fine():\n    pass\n")
    report = check_task(cases_task, subprocess_runner)
    assert report.problems == ["buggy: every hidden test passes (the bug is not caught)"]


def test_checker_fails_a_task_with_hidden_tests_grading_does_not_count(cases_task, tmp_path):
    """Grading reads the hidden tests' names from their files' text: an inherited test method runs
    but never counts. The checker said ok to a task whose one failing test was inherited, and the
    untouched buggy repo graded 1.0."""
    (cases_task.hidden_dir / "test_hidden_cases.py").write_text(
        "from numerals.roman import from_roman\n\n\ndef test_additive():\n    assert from_roman('VIII') == 8\n\n\n"
        "class Base:\n    def test_four(self):\n        assert from_roman('IV') == 4\n\n\n"
        "class TestInherited(Base):\n    pass\n")
    assert grade(cases_task, copy_repo(cases_task, tmp_path / "work")).fraction == 1.0
    assert check_task(cases_task, subprocess_runner).problems == [
        "hidden tests that grading does not count (it reads test functions and Test* methods as "
        f"written in their file: not inherited or generated ones): {CASES_FILE}::TestInherited::test_four"]


def test_grading_counts_each_parametrized_case(cases_task, tmp_path):
    work = copy_repo(cases_task, tmp_path / "work")
    buggy = grade_work(cases_task, work)
    assert {o.id for o in buggy.outcomes} == CASE_IDS and set(buggy.failed_ids) == BUGGY_FAILS
    assert (buggy.passed, buggy.total) == (5, 9)
    ok, msg = apply_patch(work, cases_task.solution_patch())
    assert ok, msg
    fixed = grade_work(cases_task, work)
    assert (fixed.passed, fixed.total, fixed.fraction) == (9, 9, 1.0)


def test_grading_parametrized_cases_from_the_summary(cases_task, tmp_path):
    """A runner that does not share the junit file: ids with spaces in their params still parse."""

    def remote_runner(argv, workdir, timeout_s):
        out = subprocess_runner(argv, workdir, timeout_s)
        (workdir / ".rolecast-grade.xml").unlink()
        return out

    g = grade(cases_task, copy_repo(cases_task, tmp_path / "work"), remote_runner)
    assert {o.id for o in g.outcomes} == CASE_IDS and set(g.failed_ids) == BUGGY_FAILS


def test_hidden_test_that_reports_nothing_counts_as_not_run(cases_task, tmp_path):
    (cases_task.hidden_dir / "test_hidden_gone.py").write_text("def test_gone():\n    pass\n\n\ndel test_gone\n")
    g = grade(cases_task, copy_repo(cases_task, tmp_path / "work"))
    assert (g.passed, g.total) == (5, 10)
    gone = [o for o in g.outcomes if o.id == "tests/hidden/test_hidden_gone.py::test_gone"]
    assert [(o.status, o.message) for o in gone] == [("error", "not run")]


def test_checker_says_a_crashed_test_run_crashed_and_why(cases_task):
    report = check_task(cases_task, lambda argv, workdir, timeout_s: RunOutcome(2, "", "ImportError:  boom\n"))
    assert report.problems == [f"{label}: test run crashed (exit 2): ImportError: boom" for label in ("buggy", "fixed")]


def test_checker_says_a_hung_test_run_timed_out(cases_task):
    report = check_task(cases_task, lambda argv, workdir, timeout_s: RunOutcome(124, "", "", timed_out=True))
    assert report.problems[:2] == [f"buggy: the test run timed out after {cases_task.timeout_s:g}s (task timeout_s)",
                                   f"fixed: the test run timed out after {cases_task.timeout_s:g}s (task timeout_s)"]
