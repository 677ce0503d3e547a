"""Proving a task sound: visible tests pass on the bug, a hidden test fails there, and with the
reference patch every test passes."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sandboxes.pool import temporary_dir

from .grading import Grade, install_hidden_tests, is_case, run_tests
from .running import Runner, apply_patch, copy_repo, subprocess_runner
from .task import IssueTask


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
    ``solution.patch`` applied every visible and every hidden test passes, and grading counts
    each hidden test that ran.
    """
    rep = CheckReport(task.id)
    hidden_ids = task.hidden_test_ids()
    hidden_files = task.hidden_test_files()
    if not hidden_ids:
        rep.problems.append("no hidden test functions found")
        return rep
    with temporary_dir(prefix=f"rolecast-check-{task.id}-") as tmp:
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
            if g.timed_out:
                rep.problems.append(f"{label}: the test run timed out after {task.timeout_s:g}s (task timeout_s)")
                continue
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
                # grading counts only these ids: a task whose failing test is not one grades the bug 1.0
                uncounted = [o.id for o in hidden if not any(is_case(o.id, tid) for tid in hidden_ids)]
                if uncounted:
                    rep.problems.append("hidden tests that grading does not count (it reads test functions and "
                                        "Test* methods as written in their file: not inherited or generated ones): "
                                        + ", ".join(uncounted))
    return rep
