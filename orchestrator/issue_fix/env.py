"""``issue_fix``: a team fixes a bug report in a real repo, its tests run in a sandbox.

    protocol:
      type: issue_fix
      max_rounds: 3
      sandbox: {backend: auto, memory_mb: 1024}

Planner -> Coder -> Reviewer -> Tester, then back to the Coder until the Reviewer approves and
the tests pass, or ``max_rounds`` rounds are spent. The Coder's edits apply to the episode's own
copy of the task's repo (failures go back to it); after the Tester writes its test, the visible
tests and that test run in the sandbox and their results go to everyone. At the end the work is
graded in a fresh copy (:func:`grading.grade_work`): every role gets the fraction of hidden
tests that pass, and ``outcome()`` keeps that and each role's process reward apart. Tasks are
``{"dir": "tasks/<id>"}``, a task folder; a relative ``dir`` is taken from the current directory.
"""
from __future__ import annotations

import asyncio
import difflib
import io
import shutil
from pathlib import Path
from typing import Any

from pydantic import Field, StrictStr, field_validator, model_validator

from sandboxes import shared_pool
from sandboxes.pool import new_temporary_dir, remove_tree
from sandboxes.runner import ended_first

from ..config import SandboxOptions
from ..envs.base import Env, EnvConfig, StepResult, TaskConfig, verdict_rates
from ..messages import Message
from ..yamlfile import Loc
from .edits import EditResult, PathRefused, apply_edits, read_regular, resolve_in
from .grading import Grade, grade_work, repo_files, run_tests, workdir_changes
from .rewards import coder_reward, planner_reward, reviewer_reward, tester_reward
from .running import copy_repo, sandbox_runner
from .task import load_task


class IssueFixConfig(EnvConfig):
    planner: str = "planner"
    coder: str = "coder"
    reviewer: str = "reviewer"
    tester: str = "tester"
    max_rounds: int = Field(3, ge=1, description="Coder -> Reviewer -> Tester passes, the first included")
    sandbox: SandboxOptions = Field(default_factory=SandboxOptions)
    max_file_chars: int = Field(8000, ge=0, description="repo text shown in prompts, all files together")
    max_output_chars: int = Field(2000, ge=0, description="diff and test output shown in prompts, each")

    @model_validator(mode="after")
    def _distinct_roles(self) -> "IssueFixConfig":
        names = [name for _, name in self.role_refs()]
        if len(set(names)) < len(names):
            raise ValueError(f"planner, coder, reviewer and tester must be four different roles, got {names}")
        return self

    def role_refs(self) -> list[tuple[Loc, str]]:
        return [((key,), getattr(self, key)) for key in ("planner", "coder", "reviewer", "tester")]

    def turns_needed(self) -> int:
        return 1 + 3 * self.max_rounds  # the plan, then a Coder, Reviewer and Tester turn a round


class IssueFixTask(TaskConfig):
    dir: StrictStr  # a task folder (tasks/<id>), loaded now: a bad one is one error, not one per episode

    @field_validator("dir")
    @classmethod
    def _loads(cls, value: str) -> str:
        load_task(value)  # a TaskFileError is a ValueError: its FILE:LINE: KEY: problem becomes the message
        return value


class IssueFixEnv(Env):
    Config = IssueFixConfig
    Task = IssueFixTask
    # history/round/last as in `pipeline`, so the shared role prompts render here too.
    observation_keys = frozenset(
        {"history", "round", "last", "issue", "files", "diff", "plan", "review", "test",
         "edit_results", "test_report"}
    )
    config: IssueFixConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.issue = load_task(self.task["dir"])
        box = self.config.sandbox
        self.pool = shared_pool(box.backend, box.max_concurrent)
        # the team's code runs there: the task folder holds the hidden tests and solution.patch,
        # which it could print into test_report or copy over its work
        self.runner = sandbox_runner(self.pool.backend, box.memory_mb, box.timeout_s, hide=(self.issue.folder,))
        self._tmp = new_temporary_dir(f"rolecast-issue-{self.issue.id}-")
        try:
            self.workdir = copy_repo(self.issue, self._tmp / "repo")
        except BaseException:  # close() is never called on an env that was not made
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        c = self.config
        self.order = [c.planner, c.coder, c.reviewer, c.tester]
        self.position = 0
        self.round = 1
        self.done = False
        self.history: list[dict[str, Any]] = []
        self.plan: dict[str, Any] | None = None
        self.review: dict[str, Any] | None = None
        self.test: dict[str, str] | None = None  # the Tester's file as written to the repo
        self.edit_results: list[EditResult] = []  # the Coder's latest turn
        self.all_edits: list[EditResult] = []
        self.test_report: dict[str, Any] | None = None
        self.result: dict[str, Any] = {}

    @classmethod
    def task_from_cli(cls, value: str) -> dict[str, Any]:
        return {"dir": value}

    # ------------------------------------------------------------------------------ turns

    def next_role(self) -> str | None:
        return None if self.done else self.order[self.position]

    def recipients(self, sender: str) -> list[str]:
        return [name for name in self.order if name != sender]

    def observe(self, role: str) -> dict[str, Any]:
        return {
            "history": self.history,
            "round": self.round,
            "last": self.history[-1] if self.history else None,
            "issue": {"id": self.issue.id, "title": self.issue.title, "text": self.issue.issue.strip()},
            "files": self._files(),
            "diff": self._diff(),
            "plan": self.plan,
            "review": self.review,
            "test": self.test,
            "edit_results": [r.to_dict() for r in self.edit_results],
            "test_report": self.test_report,
        }

    async def step(self, role: str, message: Message) -> StepResult:
        content = message.content if message.valid else None
        entry: dict[str, Any] = {"role": role, "content": content, "valid": message.valid, "turn": message.turn}
        self.history.append(entry)
        c = self.config
        if role == c.planner and content is not None:
            self.plan = content
        elif role == c.coder:
            self.edit_results = apply_edits(self.workdir, content["edits"]) if content else []
            self.all_edits += self.edit_results
            entry["edit_results"] = [r.to_dict() for r in self.edit_results]
        elif role == c.reviewer:
            self.review = content
        elif role == c.tester:
            self.test_report = await self._run_team_tests(content)
            entry["test_report"] = self.test_report
        if not message.valid and c.on_invalid == "end":
            return await self._finish()
        if role != c.tester:
            self.position += 1
            return StepResult()
        approved = bool(self.review and self.review.get("verdict") == "approve")
        if (approved and self.test_report["passed"]) or self.round >= c.max_rounds:
            return await self._finish()
        self.round += 1
        self.position = self.order.index(c.coder)
        return StepResult()

    # ------------------------------------------------------------------------------ tests

    async def _run_team_tests(self, content: dict[str, Any] | None) -> dict[str, Any]:
        """Write the Tester's file (if it is acceptable), then run the team's test with the visible
        tests. An accepted file replaces the Tester's file before it (a visible-tests folder would
        collect both, and one bad early test would fail every later round); a refused one, or an
        invalid turn, leaves it: the test the prompts show and the Tester's reward grades is the
        one in the copy, and the one that runs."""
        refused = self._write_test(content["path"], content["code"]) if content is not None else None
        paths = list(self.issue.visible_tests)
        if self.test is not None and (self.workdir / self.test["path"]).is_file():  # (sandboxed code can remove it)
            paths.append(self.test["path"])
        g = await self.pool.call(run_tests, self.issue, self.workdir, self.runner, paths, [])
        report = _report(g, self.config.max_output_chars)
        if refused:
            report["summary"] = f"test file refused: {refused}; " + report["summary"]
        return report

    def _remove_last_test(self) -> None:
        if self.test is None:
            return
        try:
            resolve_in(self.workdir, self.test["path"]).unlink(missing_ok=True)
        except (PathRefused, OSError):  # a sandboxed run moved things about: nothing of ours to remove
            pass

    def _write_test(self, path: str, code: str) -> str | None:
        """Why the Tester's file cannot go to ``path``, or None once written there."""
        try:
            target = resolve_in(self.workdir, path)
            rel = target.relative_to(self.workdir.resolve())
            if rel.is_relative_to(self.issue.hidden_dest):
                return f"{path} is reserved for the graders' tests"
            if (self.issue.repo_dir / rel).exists():
                return f"{path} is one of the project's own files; choose a new file name"
            if target in self._coder_files():  # overwritten, then removed with the Tester's next file
                return f"{path} is a file the Coder wrote; choose a new file name"
            data = code.encode("utf-8")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)  # whatever a sandboxed run left there (a link, a FIFO)
            target.write_bytes(data)
        except PathRefused as exc:
            return str(exc)
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape
            return "the code is not valid Unicode text"
        except OSError as exc:  # a name too long, a folder in the way
            return f"{path}: {exc.strerror or exc}"
        if self.test is not None and self.test["path"] != rel.as_posix():
            self._remove_last_test()
        # pytest names tests by the normalised path (tests/./x.py is tests/x.py)
        self.test = {"path": rel.as_posix(), "code": code}
        return None

    def _coder_files(self) -> set[Path]:
        """Where the Coder's applied edits wrote, resolved as the Tester's path is."""
        files = set()
        for result in self.all_edits:
            if result.ok:
                try:
                    files.add(resolve_in(self.workdir, result.path))
                except PathRefused:  # a sandboxed run moved things about since
                    pass
        return files

    # ------------------------------------------------------------------------------ the end

    async def _finish(self) -> StepResult:
        self.done = True
        # both run to their end, whichever raises and however cancelled: gather returned at the first
        # to raise (a cancel too, once its job ended), and close() removed the copy under the grading
        graded, repro = results = await ended_first(asyncio.gather(
            self.pool.call(grade_work, self.issue, self.workdir, self.runner),
            self.pool.call(tester_reward, self.issue, self.test["path"], self.test["code"], self.runner)
            if self.test else _nothing((0.0, "no test file was written")),
            return_exceptions=True,
        ))
        if error := next((r for r in results if isinstance(r, BaseException)), None):
            raise error
        c = self.config
        outcome = graded.fraction
        verdict = self.review.get("verdict") if self.review else None
        self.result = {
            "hidden_passed": graded.passed,
            "hidden_total": graded.total,
            "outcome": outcome,
            "hidden_failed": graded.failed_ids,
            "ignored_changes": graded.ignored,
            "edits_applied": sum(r.ok for r in self.all_edits),
            "edits_total": len(self.all_edits),
            "approved": None if verdict is None else verdict == "approve",  # None: no valid verdict, a miss
            "tests_passed": self.test_report["passed"] if self.test_report else None,
            "process": {
                c.planner: planner_reward((self.plan or {}).get("files", []), self.issue.solution_files()),
                c.coder: coder_reward(self.all_edits),
                c.reviewer: reviewer_reward(verdict, outcome),
                c.tester: repro[0],
            },
            "tester_check": repro[1],
        }
        return StepResult(rewards={name: outcome for name in self.roles}, done=True)

    def outcome(self) -> dict[str, Any]:
        return {"task": self.issue.id, "rounds": self.round, **self.result}

    @classmethod
    def outcome_metrics(cls, config: EnvConfig, outcomes: list[dict[str, Any]]) -> dict[str, float]:
        """The share of episodes that fixed the issue (every hidden test passes), and how often the
        Reviewer approves fixed work and turns down the rest: when the Coder rarely fixes
        anything, a Reviewer that never approves earns a high reward and a balanced accuracy of 0.5."""
        graded = [o for o in outcomes if "outcome" in o]
        if not graded:
            return {}
        fixed = [o["outcome"] == 1.0 for o in graded]
        return {"solved_rate": sum(fixed) / len(fixed),
                **verdict_rates("reviewer", [(f, o["approved"]) for f, o in zip(fixed, graded)])}

    async def close(self) -> None:
        await asyncio.to_thread(remove_tree, self._tmp)  # however deep sandboxed code nested it

    # ------------------------------------------------------------------------------ views

    def _files(self) -> list[dict[str, str]]:
        """The repo as it is now, source before tests, cut to ``max_file_chars`` in all."""
        files = sorted(repo_files(self.workdir), key=lambda p: (p.startswith(("tests/", "test/")), p))
        budget = self.config.max_file_chars
        shown = []
        for rel in files:
            text = (read_regular(self.workdir / rel) or b"").decode("utf-8", "replace")
            if len(text) > budget:
                text = text[:budget] + "\n... (cut)" if budget else "(not shown: too much text)"
                budget = 0
            else:
                budget -= len(text)
            shown.append({"path": rel, "text": text})
        return shown

    def _diff(self) -> str:
        chunks = []
        for rel in workdir_changes(self.issue, self.workdir):
            before = (read_regular(self.issue.repo_dir / rel) or b"").decode("utf-8", "replace")
            after = (read_regular(self.workdir / rel) or b"").decode("utf-8", "replace")
            chunks += (line if line.endswith("\n") else line + NO_NEWLINE for line in difflib.unified_diff(
                _lines(before), _lines(after), f"a/{rel}", f"b/{rel}"))
        return _cut("".join(chunks), self.config.max_output_chars)


# after a last line without one, as diff writes it: else the next line (another file's header) ran on from it
NO_NEWLINE = "\n\\ No newline at end of file\n"


def _lines(text: str) -> list[str]:
    """A file's lines as diff and git count them, ended by "\\n" only (str.splitlines ends one at a
    form feed or a U+2028 in a string literal too)."""
    return io.StringIO(text, newline="\n").readlines()


def _report(g: Grade, limit: int) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for o in g.outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    if g.crashed:
        summary = "the test run crashed" + (" (timed out)" if g.timed_out else f" (exit {g.exit_code})")
    else:
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no tests ran"
    return {
        "passed": not g.crashed and bool(g.outcomes) and all(o.ok for o in g.outcomes),
        "summary": summary,
        "failures": [f"{o.id}: {o.message}" if o.message else o.id for o in g.outcomes if not o.ok],
        "output": _cut(g.log, limit, tail=True),
    }


def _cut(text: str, limit: int, tail: bool = False) -> str:
    if len(text) <= limit:
        return text
    # text[-0:] would be the whole text: a limit of 0 kept all of a test run's output
    return "(cut) ...\n" + text[len(text) - limit:] if tail else text[:limit] + "\n... (cut)"


async def _nothing(value: Any) -> Any:
    return value
