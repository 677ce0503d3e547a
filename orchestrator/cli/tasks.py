"""``rolecast tasks check DIR...``: prove issue-fixing tasks sound, each run in the sandbox.

A DIR is a task folder (holding task.yaml) or a folder of task folders; plain files are
skipped, so ``rolecast tasks check tasks/*`` works with tasks/README.md there; a task named twice
is checked once. Every task is loaded before any runs: each bad task.yaml is one line
(``FILE:LINE: KEY: problem``) on stderr, and so is each DIR that names no task, all of them,
then exit code 2. Then each task is checked
(:func:`issue_fix.checking.check_task` with :func:`issue_fix.running.sandbox_runner`): one row
per task, a summary, exit code 1 when any task fails (a sandbox fault fails that task only).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sandboxes

from .. import logs
from ..errors import EXIT_USAGE
from ..issue_fix.checking import CheckReport, check_task
from ..issue_fix.running import sandbox_runner
from ..issue_fix.task import TASK_FILE, IssueTask, TaskFileError, load_task, task_folders
from .flags import positive_int, shows_progress


def register(sub: Any) -> None:
    tasks = sub.add_parser("tasks", help="issue-fixing task folders")
    commands = tasks.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")
    p = commands.add_parser("check", help="prove tasks sound: hidden tests fail on the bug, pass with the fix")
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="task folders, or folders of them")
    p.add_argument("--backend", default="auto", choices=["auto", *sandboxes.ISOLATING],
                   help="sandbox backend (default auto: the best available)")
    p.add_argument("--jobs", type=positive_int, default=min(4, os.cpu_count() or 1),
                   help="tasks checked at once (default: the CPUs, at most 4)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of rows, once every task is checked (a bar on stderr meanwhile)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=handle_check)


def find_tasks(paths: list[Path]) -> tuple[list[IssueTask], list[str]]:
    """The tasks ``paths`` name (see the module doc), and a line for each problem among them: a
    bad task.yaml's error, a path that names no task. Raises ValueError when the paths are all
    plain files."""
    found: list[IssueTask] = []
    bad: list[str] = []
    seen: set[Path] = set()
    for path in paths:
        if path.is_file():
            continue
        if not path.is_dir():
            bad.append(f"rolecast tasks check: {path}: no such folder")
            continue
        folders = [path] if (path / TASK_FILE).exists() else task_folders(path)
        if not folders:
            bad.append(f"rolecast tasks check: {path}: no {TASK_FILE} in it or in its subfolders")
        elif folders != [path]:
            skipped = sorted(d.name for d in path.iterdir()
                             if d.is_dir() and not d.name.startswith((".", "_")) and not (d / TASK_FILE).exists())
            if skipped:
                logs.say(f"rolecast tasks check: skipped (no {TASK_FILE}): {', '.join(skipped)}")
        for folder in folders:  # every bad one is reported, so one pass fixes a whole folder of tasks
            if folder.resolve() in seen:  # named twice (`tasks tasks/001-x`): one row, counted once
                continue
            seen.add(folder.resolve())
            try:
                found.append(load_task(folder))
            except TaskFileError as exc:
                bad.append(str(exc))
    if not found and not bad:
        raise ValueError("no task folders among " + " ".join(map(str, paths)))
    return found, bad


def handle_check(args: argparse.Namespace) -> int:
    try:
        tasks, bad = find_tasks(args.dirs)
        if bad:  # FILE:LINE: KEY: problem, as `rolecast validate` says it; all of them, then stop
            for problem in bad:
                logs.say(problem, "error")
            return EXIT_USAGE
        runner = sandbox_runner(args.backend)
    except (ValueError, sandboxes.SandboxError) as exc:
        logs.say(f"rolecast tasks check: {exc}", "error")
        return EXIT_USAGE
    from ..rollout import progress_bar

    started = time.perf_counter()
    # --json says nothing until the end, minutes for a folder of tasks: the rows are its progress else
    bar = progress_bar(args.json and shows_progress(args))
    checked = bar.add_task("tasks checked", total=len(tasks))

    def one(task: IssueTask) -> tuple[CheckReport, float]:
        t0 = time.perf_counter()
        try:
            report = check_task(task, runner)
        except sandboxes.SandboxError as exc:  # the sandbox failed, not the task: a FAIL row
            report = CheckReport(task.id, [f"sandbox fault: {exc}"])
        seconds = time.perf_counter() - t0
        if not args.json:
            print(f"{'ok  ' if report.ok else 'FAIL'} {task.id:<36} {seconds:5.1f}s"
                  + ("" if report.ok else "  " + "; ".join(report.problems)), flush=True)
        bar.advance(checked)
        return report, seconds

    with bar, ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, tasks))
    failed = [r.task_id for r, _ in results if not r.ok]
    wall = time.perf_counter() - started
    if args.json:
        print(json.dumps({
            "tasks": [{"id": r.task_id, "ok": r.ok, "problems": r.problems, "duration_s": round(s, 3)}
                      for r, s in results],
            "ok": len(results) - len(failed), "failed": len(failed), "duration_s": round(wall, 3),
        }))
    else:
        print(f"{len(results)} tasks: {len(results) - len(failed)} ok, {len(failed)} failed in {wall:.1f}s"
              + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0
