"""Process rewards of the issue-fixing team, one per role, each in [0, 1].

They say whether a role did its own part well, whatever the team's outcome (the fraction of
hidden tests that pass); mixing them with the outcome is the trainer's business.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sandboxes.pool import temporary_dir

from .edits import EditResult, PathRefused, resolve_in
from .grading import run_tests
from .running import Runner, apply_patch, copy_repo
from .task import IssueTask, static_test_names


def _norm(path: str) -> str:
    path = path.strip().replace("\\", "/")
    for prefix in ("./", "repo/"):
        path = path.removeprefix(prefix)
    return path


def planner_reward(plan_files: Iterable[str], fix_files: Iterable[str]) -> float:
    """F1 of the files the plan names against the files ``solution.patch`` touches.

    An entry names a fix file when it equals its path or a trailing part of it (``slug.py`` names
    ``textkit/slug.py``). F1 rather than recall, so listing every file in the repo does not pay.
    """
    named = {_norm(p) for p in plan_files if _norm(p)}
    fix = set(fix_files)
    if not named or not fix:
        return 0.0

    def names(entry: str, file: str) -> bool:
        return file == entry or file.endswith("/" + entry)

    recall = sum(any(names(e, f) for e in named) for f in fix) / len(fix)
    precision = sum(any(names(e, f) for f in fix) for e in named) / len(named)
    return 0.0 if recall + precision == 0 else 2 * recall * precision / (recall + precision)


def coder_reward(results: Iterable[EditResult]) -> float:
    """The fraction of all the Coder's edits, over every round, that applied (0 with none)."""
    results = list(results)
    return sum(r.ok for r in results) / len(results) if results else 0.0


def reviewer_reward(verdict: str | None, outcome: float) -> float:
    """1 when the last verdict is right: approve exactly when every hidden test passes."""
    if verdict is None:
        return 0.0
    return float((verdict == "approve") == (outcome == 1.0))


def tester_reward(task: IssueTask, path: str, code: str, runner: Runner) -> tuple[float, str]:
    """(1, why) when the Tester's test file fails on the buggy repo and passes with the fix.

    It runs alone (no other tests) in two fresh copies, buggy and with ``solution.patch``.
    """
    try:
        names = static_test_names(code)
    except SyntaxError as exc:
        return 0.0, f"the test file does not parse: {exc.msg} (line {exc.lineno})"
    if not names:
        return 0.0, "the test file holds no test functions"
    ids = [f"{path}::{name}" for name in names]
    grades = {}
    for label in ("buggy", "fixed"):
        # each copy under the same name in a folder of its own: a test that read its label from
        # the working directory (`assert "fixed" in os.getcwd()`) would earn 1 without the bug
        with temporary_dir(prefix=f"rolecast-repro-{task.id}-") as tmp:
            work = copy_repo(task, Path(tmp) / "repo")
            if label == "fixed":
                ok, msg = apply_patch(work, task.solution_patch())
                if not ok:
                    return 0.0, f"solution.patch does not apply: {msg}"
            try:
                target = resolve_in(work, path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(code, encoding="utf-8")
            except PathRefused as exc:
                return 0.0, str(exc)
            except OSError as exc:  # a file of repo/ where its folder goes (sandboxed code made one there)
                return 0.0, f"{path}: {exc.strerror or exc}"
            grades[label] = run_tests(task, work, runner, [path], ids)
    buggy, fixed = grades["buggy"], grades["fixed"]
    if not buggy.crashed and all(o.ok for o in buggy.outcomes):
        return 0.0, "the test passes on the buggy code (it does not reproduce the issue)"
    if fixed.crashed or not all(o.ok for o in fixed.outcomes):
        return 0.0, "the test fails with the reference fix: " + ", ".join(fixed.failed_ids or ["crashed"])
    return 1.0, "fails on the buggy code, passes with the fix"
