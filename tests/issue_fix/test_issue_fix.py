"""The issue-fixing team end to end, with replay and Python policies (no model), in the sandbox."""
from __future__ import annotations

import asyncio
import json
import shutil
import re
import subprocess
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import sandboxes
from sandboxes.pool import scratch_root
from orchestrator.issue_fix.edits import MAX_FILE_BYTES, apply_edits, is_regular
from orchestrator.issue_fix.env import _report
from orchestrator.issue_fix.grading import Grade, grade, grade_work, graded_path, repo_files, run_tests, workdir_changes
from orchestrator.issue_fix import grading, rewards
from orchestrator.issue_fix.rewards import coder_reward, planner_reward, reviewer_reward
from orchestrator.issue_fix.running import RunOutcome, apply_patch, copy_repo, sandbox_runner, subprocess_runner
from orchestrator.issue_fix.task import REPORT_FILE, load_task, task_folders
from orchestrator.policies.binding import Binding
from orchestrator.policies.python import PythonPolicy
from orchestrator.rollout import RunOptions, build_policies, run_team
from orchestrator.team import load_team
from support import needs_sandbox, write

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes/issue_fix.yaml"
SLUG = ROOT / "tasks/001-slugify-unicode"


def patch_edits(patch: str) -> list[dict[str, str]]:
    """The hunks of a unified diff as search/replace edits (context and removed -> context and added)."""
    edits: list[dict[str, str]] = []
    path = ""
    for block in re.split(r"^(?=\+\+\+ |@@ )", patch, flags=re.M):
        if block.startswith("+++ "):
            path = block.split()[1].removeprefix("b/")
        elif block.startswith("@@ "):
            search, replace = [], []
            for line in block.splitlines(True)[1:]:
                tag, text = line[:1], line[1:]
                if tag in (" ", "-"):
                    search.append(text)
                if tag in (" ", "+"):
                    replace.append(text)
            edits.append({"path": path, "search": "".join(search), "replace": "".join(replace)})
    return edits


REPRO_TEST = 'from textkit.slug import slugify\n\ndef test_accents():\n    assert slugify("Crème Brûlée") == "creme-brulee"\n'
REPRO = {"path": "tests/test_repro.py", "code": REPRO_TEST}
PLAN = {"summary": "accents are dropped", "files": ["textkit/slug.py"], "steps": ["normalise to NFKD first"]}
WRONG_FIX = {"path": "textkit/slug.py", "search": 'text = text.encode("ascii", "ignore")',
             "replace": 'text = text.replace("è", "e").encode("ascii", "ignore")'}


def replay_file(path: Path, edits: list[list[dict]], verdicts: list[str], plan: dict = PLAN,
                test: dict = REPRO) -> Path:
    """A replay transcript: the plan, then one Coder, Reviewer and Tester line per round."""
    lines = [{"role": "planner", "text": json.dumps(plan)}]
    lines += [{"role": "coder", "text": json.dumps({"edits": e, "summary": "fix"})} for e in edits]
    lines += [{"role": "reviewer", "text": json.dumps({"verdict": v, "comments": []})} for v in verdicts]
    lines += [{"role": "tester", "text": json.dumps(test)} for _ in verdicts]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def run_replay(cli, monkeypatch, tmp_path: Path, replay: Path) -> dict:
    """``rolecast run recipes/issue_fix.yaml --task tasks/001-...`` with every role replayed."""
    args = ["run", RECIPE, "--task", SLUG.relative_to(ROOT), "--episodes", "1", "--out", tmp_path / "out", "--no-progress"]
    for role in ("planner", "coder", "reviewer", "tester"):
        args += ["--policy", f"{role}=replay:{replay}"]
    monkeypatch.chdir(ROOT)
    code, out, err = cli(*args)
    assert code == 0, err
    (episode,) = [json.loads(line) for line in (tmp_path / "out/transcripts.jsonl").read_text().splitlines()]
    assert episode["status"] == "ok", episode["error"]
    return episode


def scratch(monkeypatch, tmp_path: Path) -> Path:
    """Make the env's per-episode copies land in a folder the test can watch: the process's scratch
    folder in a temp dir of the test's own."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return scratch_root()


def run(team, policies, tmp_path: Path, episodes: int = 1):
    options = RunOptions(episodes=episodes, seed=0, out_dir=tmp_path / "run", progress=False)
    return asyncio.run(run_team(team, policies, options))


def team_for(tmp_path: Path, max_rounds: int = 2, task: Path = SLUG, sandbox: str | None = None):
    """The recipe with fewer rounds and an absolute task dir (so the cwd does not matter)."""
    text = RECIPE.read_text().replace("max_rounds: 3", f"max_rounds: {max_rounds}")
    if sandbox:
        text = re.sub(r"sandbox: .*", f"sandbox: {sandbox}", text)
    text = text.replace("../roles/", f"{ROOT}/roles/")
    text = re.sub(r"tasks:\n(  - .*\n)+", f"tasks:\n  - {{dir: {task}}}\n", text)
    return load_team(write(tmp_path / "issue_fix.yaml", text))


# ------------------------------------------------------------------------------ whole episodes


@needs_sandbox
def test_replayed_reference_fix_earns_one(tmp_path, cli, monkeypatch):
    folder = scratch(monkeypatch, tmp_path)
    replay = replay_file(tmp_path / "ref.jsonl", [patch_edits(load_task(SLUG).solution_patch())], ["approve"])
    episode = run_replay(cli, monkeypatch, tmp_path, replay)
    assert [t["role"] for t in episode["turns"]] == ["planner", "coder", "reviewer", "tester"]  # one round
    outcome = episode["outcome"]
    assert outcome["outcome"] == 1.0 and outcome["hidden_passed"] == outcome["hidden_total"] > 0
    assert outcome["process"] == {"planner": 1.0, "coder": 1.0, "reviewer": 1.0, "tester": 1.0}
    assert outcome["tests_passed"] is True and outcome["ignored_changes"] == ["tests/test_repro.py"]
    assert episode["rewards"] == {"planner": 1.0, "coder": 1.0, "reviewer": 1.0, "tester": 1.0}
    assert list(folder.iterdir()) == []  # the episode's copy is gone
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["env"] == {"solved_rate": 1.0, "reviewer_accepts_right": 1.0}


@needs_sandbox
def test_replayed_wrong_fix_earns_less_and_failed_edits_go_back_to_the_coder(tmp_path, cli, monkeypatch):
    folder = scratch(monkeypatch, tmp_path)
    replay = replay_file(
        tmp_path / "wrong.jsonl",
        [[WRONG_FIX]] * 3,  # the same edit each round: only the first applies
        ["request_changes", "request_changes", "approve"],
        plan={"summary": "x", "files": ["textkit/slug.py", "README"], "steps": ["y"]},
        test={"path": "tests/test_ok.py", "code": "def test_ok():\n    pass\n"},
    )
    episode = run_replay(cli, monkeypatch, tmp_path, replay)
    turns = episode["turns"]
    assert [t["role"] for t in turns] == ["planner"] + ["coder", "reviewer", "tester"] * 3
    out = episode["outcome"]
    assert 0 < out["outcome"] < 1.0 and out["hidden_passed"] < out["hidden_total"]
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["env"] == {"solved_rate": 0.0, "reviewer_rejects_wrong": 0.0}  # it approved in the end
    assert out["rounds"] == 3 and out["edits_applied"] == 1 and out["edits_total"] == 3
    assert out["process"]["coder"] == pytest.approx(1 / 3)
    assert out["process"]["reviewer"] == 0.0  # approved a change that fails hidden tests
    assert out["process"]["tester"] == 0.0 and "passes on the buggy code" in out["tester_check"]
    assert out["process"]["planner"] == pytest.approx(2 / 3)  # recall 1, precision 1/2
    assert episode["rewards"]["coder"] == out["outcome"]
    # the Coder is told how its edits went: round 2 sees round 1's, round 3 sees round 2's failure
    prompts = [t["attempts"][0]["messages"][-1]["content"] for t in turns if t["role"] == "coder"]
    assert "applied: edited textkit/slug.py" in prompts[1]
    assert "FAILED: `search` text not found in textkit/slug.py" in prompts[2]
    assert "Reviewer: request_changes" in prompts[2] and "Tests: 4 passed" in prompts[2]  # 3 visible + the tester's
    assert list(folder.iterdir()) == []


@needs_sandbox
def test_team_cannot_game_grading(tmp_path, monkeypatch):
    """Test config, test files and a shadowing module the Coder writes are left out of grading."""
    scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=1)
    task = load_task(SLUG)
    hidden = task.hidden_test_files()[0]
    cheats = [{"path": path, "search": "", "replace": text} for path, text in CHEATS["conftest.py"]]
    cheats += [{"path": path, "search": "", "replace": text} for path, text in CHEATS["pytest.py"]]
    cheats += [{"path": "pytest.ini", "search": "pythonpath = .", "replace": "pythonpath = .\naddopts = -p no:python"},
               {"path": hidden, "search": "", "replace": "def test_fine():\n    pass\n"}]
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies.update(
        planner=PythonPolicy(lambda r: json.dumps(PLAN)),
        coder=PythonPolicy(lambda r: json.dumps({"edits": cheats})),
        reviewer=PythonPolicy(lambda r: '{"verdict": "approve"}'),
        tester=PythonPolicy(lambda r: json.dumps(REPRO)),
    )
    (ep,) = run(team, policies, tmp_path).episodes
    buggy = grade(task, copy_repo(task, tmp_path / "buggy"))
    assert ep.outcome["edits_applied"] == len(cheats)
    assert ep.outcome["outcome"] == buggy.fraction < 1.0
    assert set(ep.outcome["ignored_changes"]) >= {"conftest.py", "pytest.ini", "pytest.py", hidden}


# Files a team could write to pass every hidden test without fixing anything. Each works on
# its own when the grader runs in the team's folder (test_grading_guard proves it).
FORCE_PASS = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    (yield).get_result().outcome = "passed"
"""
FAKE_PYTEST = """import pathlib, re
cases = "".join(f'<testcase file="{f.as_posix()}" classname="x" name="{n}"/>'
                for f in pathlib.Path("tests/hidden").glob("test_*.py")
                for n in re.findall(r"^def (test\\w*)", f.read_text(), re.M))
pathlib.Path(".rolecast-grade.xml").write_text(f"<testsuite>{cases}</testsuite>")
"""
CHEATS = {
    "conftest.py": [("conftest.py", FORCE_PASS)],
    "tests/conftest.py": [("tests/conftest.py", FORCE_PASS)],
    "pytest.ini": [("pytest.ini", "[pytest]\npythonpath = .\naddopts = -p textkit.cheat\n"),
                   ("textkit/cheat.py", FORCE_PASS)],  # a new module in a package is graded, harmlessly
    "pytest.py": [("pytest.py", FAKE_PYTEST)],
}


@pytest.mark.parametrize("cheat", CHEATS)
def test_grading_guard(tmp_path, cheat):
    task = load_task(SLUG)
    buggy = grade(task, copy_repo(task, tmp_path / "buggy")).fraction
    copies = [copy_repo(task, tmp_path / name) for name in ("naive", "guarded")]
    for work in copies:
        for path, text in CHEATS[cheat]:
            write(work / path, text)
    assert buggy < 1.0 and grade(task, copies[0]).fraction == 1.0  # the cheat works on a naive grader
    guarded = grade_work(task, copies[1])
    assert guarded.fraction == buggy and guarded.ignored == [cheat]


def test_grading_takes_the_fix_with_the_cheats(tmp_path):
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "work")
    for path, text in CHEATS["conftest.py"]:
        write(work / path, text)
    assert apply_patch(work, task.solution_patch())[0]
    graded = grade_work(task, work)
    assert graded.fraction == 1.0 and graded.ignored == ["conftest.py"]


@pytest.mark.parametrize("left", ["file", "link"])
def test_grade_replaces_whatever_is_at_the_hidden_tests_place(tmp_path, left):
    """grade() installs the hidden tests over what a workdir holds there: a file made rmtree raise
    NotADirectoryError, a link (to a folder of the host's) "Cannot call rmtree on a symbolic link"."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "work")
    dest = work / task.hidden_dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("host")
    dest.write_text("x") if left == "file" else dest.symlink_to(outside)
    assert grade(task, work).fraction < 1.0
    assert dest.is_dir() and not dest.is_symlink() and (outside / "keep.txt").read_text() == "host"


@needs_sandbox
def test_invalid_turns_and_crashes_still_clean_up(tmp_path, monkeypatch):
    folder = scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=1)

    def boom(request):
        raise RuntimeError("policy down")

    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies["coder"] = PythonPolicy(boom)
    (ep,) = run(team, policies, tmp_path).episodes
    assert ep.status == "error" and "policy down" in ep.error
    assert list(folder.iterdir()) == []

    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies["coder"] = PythonPolicy(lambda r: "no JSON here")
    (ep,) = run(team, policies, tmp_path).episodes
    assert ep.status == "ok" and ep.outcome["outcome"] < 1.0
    assert ep.outcome["edits_total"] == 0 and ep.outcome["process"]["coder"] == 0.0
    assert ep.rewards["coder"] == ep.outcome["outcome"] - 1.0  # the invalid turn's penalty
    assert list(folder.iterdir()) == []

    # a fault of the sandbox itself ends the episode as an error (never graded as the team's work)
    monkeypatch.setattr(sandboxes, "run", _broken_sandbox)
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    (ep,) = run(team, policies, tmp_path).episodes
    assert ep.status == "error" and ep.error == "SandboxSetupError: no cgroup here"
    assert [t.role for t in ep.turns] == ["planner", "coder", "reviewer", "tester"] and ep.outcome == {}
    assert list(folder.iterdir()) == []


def _broken_sandbox(*args, **kwargs):
    raise sandboxes.SandboxSetupError("no cgroup here")


@needs_sandbox
def test_sandboxes_are_bounded_across_episodes(tmp_path, monkeypatch):
    scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=1, sandbox="{max_concurrent: 1}")
    real_run, lock = sandboxes.run, threading.Lock()
    active, peak, runs = 0, 0, 0

    def counting_run(*args, **kwargs):
        nonlocal active, peak, runs
        with lock:
            active, runs = active + 1, runs + 1
            peak = max(peak, active)
        try:
            return real_run(*args, **kwargs)
        finally:
            with lock:
                active -= 1

    monkeypatch.setattr(sandboxes, "run", counting_run)
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies["tester"] = PythonPolicy(lambda r: json.dumps(REPRO))
    episodes = run(team, policies, tmp_path, episodes=2).episodes
    assert [ep.status for ep in episodes] == ["ok"] * 2
    # per episode: the team's tests, grading, the Tester's test on the buggy and the fixed code
    assert runs == 8 and peak == 1


def test_unknown_role_and_bad_task_are_errors(tmp_path):
    from orchestrator.errors import ConfigError

    text = RECIPE.read_text().replace("type: issue_fix", "type: issue_fix\n  tester: qa")
    text = text.replace("../roles/", f"{ROOT}/roles/")
    with pytest.raises(ConfigError, match="routes to unknown role 'qa'"):
        load_team(write(tmp_path / "bad.yaml", text))
    with pytest.raises(ConfigError, match="four different roles"):
        load_team(write(tmp_path / "same.yaml", text.replace("tester: qa", "tester: coder")))
    env_class = load_team(RECIPE).env_class
    assert env_class.task_from_cli(str(SLUG)) == {"dir": str(SLUG)}


def test_bad_task_dir_is_one_error_before_any_episode(tmp_path, cli):
    code, out, err = cli("run", RECIPE, "--task", tmp_path / "nope", "--out", tmp_path / "out")
    assert code == 2 and not (tmp_path / "out").exists()
    assert err.strip().startswith(f"rolecast: --task {tmp_path}/nope: dir: {tmp_path}/nope/task.yaml: (file): file not found (got ")


# ------------------------------------------------------------------------------ parts


def test_edits_apply_exactly_or_say_why(tmp_path):
    write(tmp_path / "pkg/mod.py", "a = 1\nb = 1\n")
    (tmp_path / "link.py").symlink_to("/etc/hostname")
    results = apply_edits(tmp_path, [
        {"path": "pkg/mod.py", "search": "a = 1", "replace": "a = 2"},
        {"path": "pkg/mod.py", "search": " = 1", "replace": " = 3"},  # twice? no: once after the first edit
        {"path": "pkg/mod.py", "search": "c = 1", "replace": ""},
        {"path": "pkg/mod.py", "search": "b  =  3", "replace": ""},
        {"path": "pkg/new.py", "search": "", "replace": "x = 0\n"},
        {"path": "pkg/new.py", "search": "", "replace": "x = 1\n"},
        {"path": "../evil.py", "search": "", "replace": ""},
        {"path": "/etc/passwd", "search": "root", "replace": ""},
        {"path": "link.py", "search": "a", "replace": "b"},
        {"path": "missing.py", "search": "a", "replace": "b"},
        {"path": "pkg/mod.py", "search": "a = 2", "replace": "a = 2"},  # applied, and paid, for nothing
    ])
    assert [r.ok for r in results] == [True, True, False, False, True, False, False, False, False, False, False]
    assert (tmp_path / "pkg/mod.py").read_text() == "a = 2\nb = 3\n"
    assert (tmp_path / "pkg/new.py").read_text() == "x = 0\n"
    assert "not found" in results[2].message and "other indentation or spacing" in results[3].message
    assert "already exists" in results[5].message and "without '..'" in results[6].message
    assert "outside the repository" in results[8].message and "no such file" in results[9].message
    assert "changes nothing" in results[10].message
    # a search of only whitespace found nowhere gets no hint: its spacing-free text is "in" any file
    (blank,) = apply_edits(tmp_path, [{"path": "pkg/mod.py", "search": "\t", "replace": ""}])
    assert blank.message == "`search` text not found in pkg/mod.py; copy it exactly from the file"
    amb = apply_edits(tmp_path, [{"path": "pkg/mod.py", "search": "= ", "replace": ""}])[0]
    assert not amb.ok and "occurs 2 times" in amb.message
    write(tmp_path / "pkg/three.py", "pass\npass\npass\n")  # two places, overlapping: at the first and the second
    (overlap,) = apply_edits(tmp_path, [{"path": "pkg/three.py", "search": "pass\npass\n", "replace": "x = 1\n"}])
    assert not overlap.ok and "occurs 2 times" in overlap.message
    assert (tmp_path / "pkg/three.py").read_text() == "pass\npass\npass\n"
    assert coder_reward(results) == pytest.approx(3 / 11) and coder_reward([]) == 0.0


def test_an_edit_takes_a_path_as_the_repo_names_it(tmp_path):
    write(tmp_path / "pkg/mod.py", "a = 1\n")
    results = apply_edits(tmp_path, [
        {"path": " pkg/mod.py\n", "search": "a = 1", "replace": "a = 2"},  # a model's stray spaces: the same file
        {"path": str(tmp_path / "pkg/mod.py"), "search": "a = 2", "replace": "a = 3"},  # absolute, even inside
        {"path": "pkg/sub/deep/new.py", "search": "", "replace": "x = 1\n"},  # its folders are made
    ])
    assert [r.ok for r in results] == [True, False, True] and "without '..'" in results[1].message
    assert (tmp_path / "pkg/mod.py").read_text() == "a = 2\n" and (tmp_path / "pkg/sub/deep/new.py").read_text() == "x = 1\n"
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == ["mod.py", "sub"]


def test_an_edit_of_a_file_too_large_to_read_whole_leaves_it_whole(tmp_path):
    big = "START = 0\n" + "x = 1\n" * 200_000 + "END = 0\n"  # over edits.MAX_FILE_BYTES
    write(tmp_path / "pkg/data.py", big)
    (result,) = apply_edits(tmp_path, [{"path": "pkg/data.py", "search": "START = 0", "replace": "START = 1"}])
    assert not result.ok and "too large" in result.message
    assert (tmp_path / "pkg/data.py").read_text() == big  # it was cut to its first 1 MB, and "edited"
    at_limit = "START = 0\n" + "#" * (MAX_FILE_BYTES - 11) + "\n"  # 1 MB exactly: still edited
    write(tmp_path / "pkg/data.py", at_limit)
    (result,) = apply_edits(tmp_path, [{"path": "pkg/data.py", "search": "START = 0", "replace": "START = 1"}])
    assert result.ok and (tmp_path / "pkg/data.py").read_text() == at_limit.replace("START = 0", "START = 1")


def test_hostile_edits_fail_with_a_reason_and_change_nothing(tmp_path):
    write(tmp_path / "pkg/mod.py", "a = 1\n")
    results = apply_edits(tmp_path, [
        {"path": "x" * 300 + ".py", "search": "", "replace": ""},
        {"path": "pkg/a\0b.py", "search": "", "replace": ""},
        {"path": "pkg/mod.py/inner.py", "search": "", "replace": "x = 1\n"},
        {"path": "pkg/mod.py", "search": "a = 1", "replace": "a = '\ud800'"},
        {"path": "pkg/new.py", "search": "", "replace": "\ud800"},
        {"path": "pkg\\new.py", "search": "", "replace": "x = 1\n"},  # one name on Linux, a folder's file elsewhere
    ])
    assert [r.ok for r in results] == [False] * 6
    assert "too long" in results[0].message and "NUL" in results[1].message
    assert "File exists" in results[2].message  # a file where a folder is needed
    assert all("not valid Unicode" in r.message for r in results[3:5]) and "without '..'" in results[5].message
    assert (tmp_path / "pkg/mod.py").read_text() == "a = 1\n" and sorted(p.name for p in (tmp_path / "pkg").iterdir()) == ["mod.py"]


def test_an_edit_never_writes_into_a_fifo_a_run_left(tmp_path):
    """A new file's place holding a FIFO (sandboxed code can leave one) already exists: opened to be
    written, it would block the episode until some reader came."""
    import os

    os.mkfifo(tmp_path / "pipe.py")
    reader = os.open(tmp_path / "pipe.py", os.O_RDONLY | os.O_NONBLOCK)  # a write would not block the test
    try:
        created, edited = apply_edits(tmp_path, [{"path": "pipe.py", "search": "", "replace": "x = 1\n"},
                                                 {"path": "pipe.py", "search": "x", "replace": "y"}])
        assert os.read(reader, 64) == b""  # nothing was written into it
    finally:
        os.close(reader)
    assert not created.ok and "already exists" in created.message
    assert not edited.ok and "no such file" in edited.message


def test_a_link_a_run_left_is_neither_shown_nor_graded(tmp_path):
    """Sandboxed code can leave a link to a host file in the copy: followed (as root), the file was
    shown to the team as one of the repo's and graded as its change."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    (work / "textkit/leak.py").symlink_to(write(tmp_path / "secret.txt", "host secret\n"))
    assert "textkit/leak.py" not in repo_files(work) and workdir_changes(task, work) == []


@needs_sandbox
def test_hostile_test_files_are_refused_and_the_episode_goes_on(tmp_path, monkeypatch):
    folder = scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=3)
    paths = iter(["tests/" + "x" * 300 + ".py", "tests/test_slug.py", "tests/./test_repro.py"])
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies.update(
        reviewer=PythonPolicy(lambda r: '{"verdict": "request_changes"}'),
        tester=PythonPolicy(lambda r: json.dumps({"path": next(paths), "code": REPRO_TEST})),
    )
    (ep,) = run(team, policies, tmp_path).episodes
    assert ep.status == "ok", ep.error
    coder_prompts = [t.attempts[0].messages[-1]["content"] for t in ep.turns if t.role == "coder"]
    assert "Tests: test file refused: tests/xxx" in coder_prompts[1] and "File name too long" in coder_prompts[1]
    assert "Tests: test file refused: tests/test_slug.py is one of the project's own files" in coder_prompts[2]
    # the third file is kept under its normalised path, and checked there
    assert ep.outcome["ignored_changes"] == ["tests/test_repro.py"]
    assert ep.outcome["tester_check"] == "fails on the buggy code, passes with the fix"
    assert list(folder.iterdir()) == []


@needs_sandbox
def test_a_refused_test_file_leaves_the_testers_last_one_in_place(tmp_path, monkeypatch):
    """The file of the Tester's turn before was removed first: after a refusal the prompts still showed
    it and its reward graded it, but the team's runs no longer had it."""
    scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=3)
    files = iter([REPRO, {"path": "tests/test_slug.py", "code": "def test_x():\n    pass\n"},
                  {"path": "tests/test_other.py", "code": "def test_y():\n    pass\n"}])
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies.update(
        reviewer=PythonPolicy(lambda r: '{"verdict": "request_changes"}'),
        tester=PythonPolicy(lambda r: json.dumps(next(files))),
    )
    (ep,) = run(team, policies, tmp_path).episodes
    assert ep.status == "ok", ep.error
    prompts = [t.attempts[0].messages[-1]["content"] for t in ep.turns if t.role == "coder"]
    reports = [p.split("Tests: ")[1].split("\n\n")[0] for p in prompts[1:]]  # the round before's run
    assert "tests/test_repro.py::test_accents" in reports[0] and "tests/test_repro.py::test_accents" in reports[1], reports
    assert reports[1].startswith("test file refused: tests/test_slug.py is one of the project's own files")
    assert ep.outcome["tester_check"] == "the test passes on the buggy code (it does not reproduce the issue)"
    assert ep.outcome["ignored_changes"] == ["tests/test_other.py"]  # the third file replaced the first


@needs_sandbox
def test_the_tester_cannot_write_over_a_file_the_coder_created(tmp_path, monkeypatch):
    """The Tester's file went over the Coder's own new test, and the next round removed it."""
    scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=2)
    own_test = {"path": "tests/test_accents.py", "search": "", "replace": REPRO_TEST}
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies.update(
        coder=PythonPolicy(lambda r: json.dumps({"edits": [own_test]})),  # the second time: "already exists"
        reviewer=PythonPolicy(lambda r: '{"verdict": "request_changes"}'),
        tester=PythonPolicy(lambda r: json.dumps({"path": "tests/./test_accents.py", "code": "def test_x():\n    pass\n"})),
    )
    (ep,) = run(team, policies, tmp_path).episodes
    assert ep.status == "ok", ep.error
    coder_prompts = [t.attempts[0].messages[-1]["content"] for t in ep.turns if t.role == "coder"]
    assert "test file refused: tests/./test_accents.py is a file the Coder wrote" in coder_prompts[1]
    assert ep.outcome["tester_check"] == "no test file was written"


@needs_sandbox
def test_the_teams_code_cannot_read_the_task_folder(tmp_path, monkeypatch):
    """The hidden tests and solution.patch sit next to repo/: the Tester's test printed the fix
    into test_report (every role's prompt), and could have copied it over the team's work."""
    scratch(monkeypatch, tmp_path)
    outside = Path(tempfile.mkdtemp(dir="/var/tmp"))  # the sandbox never sees /tmp, where tmp_path is
    # nor /var: seen as a system folder (or the venv) is, only the env's hide= keeps the task out
    monkeypatch.setattr(sandboxes.runner, "SYSTEM", (*sandboxes.runner.SYSTEM, Path("/var/tmp")))
    try:
        outside.chmod(0o755)
        task = shutil.copytree(SLUG, outside / SLUG.name)
        team = team_for(tmp_path, max_rounds=1, task=task)
        peek = f"def test_peek():\n    print(open({str(task / 'solution.patch')!r}).read())\n"
        policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
        policies["tester"] = PythonPolicy(lambda r: json.dumps({"path": "tests/test_peek.py", "code": peek}))
        (ep,) = run(team, policies, tmp_path).episodes
        assert ep.status == "ok", ep.error
        assert ep.outcome["tests_passed"] is False
    finally:
        shutil.rmtree(outside)


@needs_sandbox
@pytest.mark.skipif(not sandboxes.cgroup.available(), reason="no memory cgroup: a MemoryError instead")
def test_a_run_killed_at_the_memory_limit_or_cut_short_says_so(tmp_path):
    """The team read "the test run crashed (exit 137)" and an empty output: nothing said why."""
    run_one = sandbox_runner(memory_mb=96)
    # 200 MB and no more: killed at memory_mb, not at some larger limit
    hog = run_one(["python", "-c", "x = [bytearray(1 << 20) for _ in range(200)]"], tmp_path, 10)
    assert hog.exit_code == 137 and hog.stderr.endswith("[sandbox] killed at the memory limit (96 MB)\n")
    loud = run_one(["python", "-c", "print('a' * 1_100_000)"], tmp_path, 10)
    assert loud.exit_code == 0 and loud.stderr.endswith("[sandbox] output cut at 1000000 bytes\n")


@needs_sandbox
@pytest.mark.skipif(not sandboxes.cgroup.available(), reason="no memory cgroup: a MemoryError instead")
def test_the_env_runs_the_teams_code_under_the_recipes_memory_limit(tmp_path, monkeypatch):
    import random

    scratch(monkeypatch, tmp_path)
    env = team_for(tmp_path, max_rounds=1, sandbox="{memory_mb: 64}").make_env({"dir": str(SLUG)}, random.Random(0))
    try:  # 200 MB fit the default 1024 MB
        hog = env.runner(["python", "-c", "x = [bytearray(1 << 20) for _ in range(200)]"], env.workdir, 10)
    finally:
        asyncio.run(env.close())
    assert hog.exit_code == 137 and hog.stderr.endswith("[sandbox] killed at the memory limit (64 MB)\n")


@needs_sandbox
def test_the_sandbox_timeout_overrides_the_tasks(tmp_path):
    """sandbox: {timeout_s: N} bounds every run, whatever the task's timeout_s."""
    slow = sandbox_runner(timeout_s=0.5)(["python", "-c", "import time; time.sleep(5)"], tmp_path, 30)
    assert (slow.exit_code, slow.timed_out) == (124, True)


@needs_sandbox
def test_the_recipe_runs_tests_under_the_tasks_own_timeout(tmp_path):
    """The recipe set sandbox timeout_s: 60, so a task's own timeout_s (2 here) was never used:
    a test sleeping 10 s passed in the team's run, though `rolecast tasks check` cut it at 2 s."""
    task = shutil.copytree(SLUG, tmp_path / SLUG.name)
    (task / "task.yaml").write_text((SLUG / "task.yaml").read_text() + "timeout_s: 2\n")
    team = team_for(tmp_path, max_rounds=1, task=task)
    slow = "import time\n\ndef test_slow():\n    time.sleep(10)\n"  # passes, given the time
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies["tester"] = PythonPolicy(lambda r: json.dumps({"path": "tests/test_repro.py", "code": slow}))
    (ep,) = run(team, policies, tmp_path).episodes
    assert ep.status == "ok", ep.error
    assert ep.outcome["tests_passed"] is False


@needs_sandbox
def test_the_sandbox_hides_its_folders_and_sets_the_test_environment(tmp_path, monkeypatch):
    """hide= (the task's folder) is hidden where the sandbox would see it (a task inside a system
    folder or the venv), and the runs get TEST_ENV (no stale byte code, no plugins)."""
    monkeypatch.setattr(sandboxes.runner, "SYSTEM", (*sandboxes.runner.SYSTEM, Path("/var/tmp")))
    task = Path(tempfile.mkdtemp(dir="/var/tmp"))
    try:
        (task / "solution.patch").write_text("the fix")
        task.chmod(0o755)
        (task / "solution.patch").chmod(0o644)
        show = "import os, sys; print(os.environ.get('PYTHONDONTWRITEBYTECODE')); print(open(sys.argv[1]).read())"
        r = sandbox_runner(hide=(task,))(["python", "-c", show, str(task / "solution.patch")], tmp_path, 10)
    finally:
        shutil.rmtree(task)
    assert r.stdout == "1\n" and "No such file" in r.stderr


def test_process_reward_rules():
    assert planner_reward(["slug.py"], ["textkit/slug.py"]) == 1.0
    assert planner_reward(["./textkit/slug.py", "README.md"], ["textkit/slug.py"]) == pytest.approx(2 / 3)
    assert planner_reward([], ["textkit/slug.py"]) == 0.0
    assert planner_reward(["a/x.py"], ["a/x.py", "a/y.py"]) == pytest.approx(2 / 3)
    assert planner_reward(["repo/textkit/slug.py", " ", ""], ["textkit/slug.py"]) == 1.0  # blank entries name nothing
    assert planner_reward(["textkit\\slug.py "], ["textkit/slug.py"]) == 1.0
    assert planner_reward(["lug.py"], ["textkit/slug.py"]) == 0.0  # a trailing part is whole names
    assert coder_reward([]) == 0.0
    assert reviewer_reward("approve", 1.0) == 1.0 and reviewer_reward("request_changes", 0.5) == 1.0
    assert reviewer_reward("approve", 0.5) == 0.0 and reviewer_reward(None, 0.0) == 0.0


def test_tester_reward_cannot_tell_the_fixed_copy_by_its_path():
    task = load_task(SLUG)
    for peek in ("os.getcwd()", "__file__"):
        code = f"import os\n\ndef test_x():\n    assert 'fixed' in os.path.abspath({peek})\n"
        assert rewards.tester_reward(task, "tests/test_x.py", code, subprocess_runner)[0] == 0.0
    assert rewards.tester_reward(task, REPRO["path"], REPRO["code"], subprocess_runner)[0] == 1.0


def test_tester_reward_needs_a_test_that_fails_on_the_bug_and_every_test_passing_with_the_fix():
    task = load_task(SLUG)
    assert rewards.tester_reward(task, "tests/test_x.py", "def test_x():\n    pass\n", subprocess_runner) == (
        0.0, "the test passes on the buggy code (it does not reproduce the issue)")
    gone = REPRO_TEST + "\n\ndef test_gone():\n    pass\n\n\ndel test_gone\n"  # in the file, never run
    assert rewards.tester_reward(task, "tests/test_x.py", gone, subprocess_runner) == (
        0.0, "the test fails with the reference fix: tests/test_x.py::test_gone")
    # said before any run: run, a file with no test (or none that parses) crashes in both copies alike
    assert rewards.tester_reward(task, "tests/test_x.py", "import textkit\n", subprocess_runner) == (
        0.0, "the test file holds no test functions")
    assert rewards.tester_reward(task, "tests/test_x.py", "def test_x(:\n", subprocess_runner) == (
        0.0, "the test file does not parse: invalid syntax (line 1)")


def test_a_tester_file_under_a_project_file_earns_zero_not_a_crash():
    """Its earlier test can turn tests/test_slug.py into a folder, so the Tester's file may live
    under it: the fresh copies could not make that folder, and the episode ended in FileExistsError."""
    task = load_task(SLUG)
    assert rewards.tester_reward(task, "tests/test_slug.py/test_x.py", REPRO_TEST, subprocess_runner) == (
        0.0, "tests/test_slug.py/test_x.py: File exists")


def test_graded_paths_are_source_modules_only(tmp_path):
    task = load_task(SLUG)
    assert graded_path(task, "textkit/slug.py") and graded_path(task, "textkit/new_helper.py")
    for rel in ("conftest.py", "textkit/conftest.py", "pytest.ini", "tests/test_slug.py", "tests/helpers.py",
                "tests/hidden/test_hidden_slug.py", "pytest.py", "textkit/test_x.py", "textkit/x_test.py", "setup.cfg",
                "notes.txt"):
        assert not graded_path(task, rel), rel
    assert not graded_path(task.model_copy(update={"hidden_dest": "textkit/checks"}), "textkit/checks/helper.py")
    write(tmp_path / "repo" / "calc.py", "")  # a top-level module the repo has is the team's to fix
    write(tmp_path / "repo" / "test" / "__init__.py", "")  # test/ is a test folder as tests/ is
    own = task.model_copy(update={"path": tmp_path})
    assert graded_path(own, "calc.py") and not graded_path(own, "test/__init__.py")


def test_grading_takes_every_file_a_reference_fix_touches():
    tasks = [load_task(f) for f in task_folders(ROOT / "tasks")]
    assert len(tasks) >= 40
    for task in tasks:
        assert task.solution_files(), task.id
        assert all(graded_path(task, rel) for rel in task.solution_files()), task.id


# ------------------------------------------------------------------------------ rolecast tasks check


@needs_sandbox
def test_tasks_check_cli(tmp_path, cli):
    code, out, err = cli("tasks", "check", SLUG, ROOT / "tasks/002-paginate-last-page", ROOT / "tasks/README.md")
    assert code == 0, err
    rows = out.strip().splitlines()
    assert sorted(r.split()[1] for r in rows[:2]) == ["001-slugify-unicode", "002-paginate-last-page"]
    assert all(r.startswith("ok") for r in rows[:2]) and rows[-1].startswith("2 tasks: 2 ok, 0 failed")

    code, out, err = cli("tasks", "check", "--json", SLUG)
    assert code == 0 and json.loads(out)["ok"] == 1
    assert "tasks checked" in err and "1/1" in err  # its bar meanwhile: --json said nothing for minutes
    code, out, err = cli("tasks", "check", "--json", "--no-progress", SLUG)
    assert code == 0 and json.loads(out)["ok"] == 1 and "1/1" not in err

    broken = tmp_path / "001-broken"
    write(broken / "task.yaml", "id: 001-broken\ntitle: x\n")
    code, out, err = cli("tasks", "check", broken)
    assert code == 2 and out == ""
    assert err.strip() == f"{broken}/task.yaml:1: issue: required key is missing"


@needs_sandbox
def test_tasks_check_fails_an_unsound_task(tmp_path, cli):
    import shutil

    task = tmp_path / "001-slugify-unicode"
    shutil.copytree(SLUG, task)
    (task / "solution.patch").write_text((task / "solution.patch").read_text().replace('"NFKD"', '"NFC"'))
    code, out, err = cli("tasks", "check", task)
    assert code == 1
    assert out.startswith("FAIL 001-slugify-unicode") and "fixed: hidden tests fail" in out


@needs_sandbox
def test_tasks_check_reports_a_sandbox_fault_per_task(cli, monkeypatch):
    monkeypatch.setattr(sandboxes, "run", _broken_sandbox)
    both = (SLUG, ROOT / "tasks/002-paginate-last-page")
    code, out, err = cli("tasks", "check", *both)
    assert code == 1 and "tasks checked" not in err  # the rows are the progress: no bar
    *rows, summary = out.strip().splitlines()
    assert [r.split()[:2] for r in sorted(rows)] == [["FAIL", "001-slugify-unicode"], ["FAIL", "002-paginate-last-page"]]
    assert all(r.endswith("sandbox fault: no cgroup here") for r in rows)
    assert re.fullmatch(r"2 tasks: 0 ok, 2 failed in [\d.]+s \(001-slugify-unicode, 002-paginate-last-page\)", summary)
    code, out, err = cli("tasks", "check", "--json", *both)
    report = json.loads(out)
    assert code == 1 and (report["ok"], report["failed"]) == (0, 2)
    assert [(t["id"], t["ok"], t["problems"]) for t in report["tasks"]] == [
        (t.name, False, ["sandbox fault: no cgroup here"]) for t in both]


def test_tasks_check_names_the_subfolders_it_skips(tmp_path, capsys):
    from orchestrator.cli.tasks import find_tasks

    shutil.copytree(SLUG, tmp_path / SLUG.name, ignore=shutil.ignore_patterns("__pycache__"))
    write(tmp_path / "misnamed" / "task.yml", "id: misnamed\n")
    (tmp_path / "__pycache__").mkdir()
    tasks, bad = find_tasks([tmp_path])
    assert [t.id for t in tasks] == [SLUG.name] and bad == []
    assert capsys.readouterr().err.strip() == "rolecast tasks check: skipped (no task.yaml): misnamed"


def test_tasks_check_checks_a_task_named_twice_once(tmp_path):
    from orchestrator.cli.tasks import find_tasks

    shutil.copytree(SLUG, tmp_path / SLUG.name, ignore=shutil.ignore_patterns("__pycache__"))
    tasks, _ = find_tasks([tmp_path, tmp_path / SLUG.name, tmp_path / SLUG.name / "repo" / ".."])
    assert [t.id for t in tasks] == [SLUG.name]  # was three rows and "3 tasks"


def test_tasks_check_refuses_a_dir_that_names_no_task(tmp_path, cli):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    write(tmp_path / "README.md", "notes\n")
    for dirs, words in (([tmp_path / "empty"], f"{tmp_path / 'empty'}: no task.yaml in it or in its subfolders"),
                        ([tmp_path / "nope"], f"{tmp_path / 'nope'}: no such folder"),
                        ([tmp_path / "README.md"], f"no task folders among {tmp_path / 'README.md'}")):
        code, out, err = cli("tasks", "check", *dirs)
        assert (code, out, err.strip()) == (2, "", f"rolecast tasks check: {words}")


def test_tasks_check_reports_every_bad_task_before_running_any(tmp_path, cli, monkeypatch):
    shutil.copytree(SLUG, tmp_path / SLUG.name, ignore=shutil.ignore_patterns("__pycache__"))
    write(tmp_path / "002-no-issue" / "task.yaml", "id: 002-no-issue\ntitle: x\n")
    write(tmp_path / "003-misnamed" / "task.yaml", "id: 003-other\n")
    monkeypatch.setattr(sandboxes, "run", _broken_sandbox)  # nothing may run while a task is bad
    code, out, err = cli("tasks", "check", tmp_path)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[0] == f"{tmp_path}/002-no-issue/task.yaml:1: issue: required key is missing"
    assert lines[1].startswith(f"{tmp_path}/003-misnamed/task.yaml:1: ") and len(lines) == 2


def test_tasks_check_reports_a_missing_folder_beside_the_bad_tasks(tmp_path, cli, monkeypatch):
    """A mistyped DIR had stopped the load at once: its line alone, the bad task.yaml hidden."""
    write(tmp_path / "001-no-issue" / "task.yaml", "id: 001-no-issue\ntitle: x\n")
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(sandboxes, "run", _broken_sandbox)
    code, out, err = cli("tasks", "check", tmp_path / "001-no-issue", tmp_path / "nope", tmp_path / "empty")
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [
        f"{tmp_path}/001-no-issue/task.yaml:1: issue: required key is missing",
        f"rolecast tasks check: {tmp_path / 'nope'}: no such folder",
        f"rolecast tasks check: {tmp_path / 'empty'}: no task.yaml in it or in its subfolders"]


def test_no_valid_verdict_is_a_miss_not_a_rejection():
    """A Reviewer that never gave a valid verdict has turned nothing down."""
    from orchestrator.issue_fix.env import IssueFixEnv

    wrong = {"outcome": 0.2}
    metrics = IssueFixEnv.outcome_metrics(None, [{**wrong, "approved": None}, {**wrong, "approved": False}])
    assert metrics == {"solved_rate": 0.0, "reviewer_rejects_wrong": 0.5}


def test_a_tester_file_of_an_earlier_round_does_not_fail_the_later_ones(tmp_path, cli, monkeypatch):
    """The visible tests are a folder: the round-one file stayed in it and failed every round after."""
    fix = patch_edits(load_task(SLUG).solution_patch())
    lines = [{"role": "planner", "text": json.dumps(PLAN)}]
    lines += [{"role": "coder", "text": json.dumps({"edits": fix, "summary": "fix"})}] * 2
    lines += [{"role": "reviewer", "text": json.dumps({"verdict": "approve", "comments": []})}] * 2
    lines += [{"role": "tester", "text": json.dumps({"path": "tests/test_bad.py", "code": "def test_bad():\n    assert False\n"})},
              {"role": "tester", "text": json.dumps(REPRO)}]
    replay = tmp_path / "rounds.jsonl"
    replay.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    out = run_replay(cli, monkeypatch, tmp_path, replay)["outcome"]
    assert (out["rounds"], out["tests_passed"], out["outcome"]) == (2, True, 1.0)  # approved and passing: done


def test_the_diff_marks_a_last_line_without_a_newline(tmp_path, cli, monkeypatch):
    """A file the Coder created without a final newline ran its last line into the next file's
    header in the Reviewer's diff: `+    return 1--- a/textkit/slug.py`. A form feed ends no line."""
    new_file = {"path": "textkit/extra.py", "search": "", "replace": "def f():\n\x0c    return 1"}
    fix = patch_edits(load_task(SLUG).solution_patch())
    replay = replay_file(tmp_path / "replay.jsonl", [[new_file, *fix]], ["approve"])
    episode = run_replay(cli, monkeypatch, tmp_path, replay)
    diff = episode["turns"][2]["attempts"][0]["messages"][-1]["content"]
    assert "\n+def f():\n+\x0c    return 1\n\\ No newline at end of file\n--- a/textkit/slug.py\n" in diff


@needs_sandbox
def test_a_file_name_that_is_not_utf8_is_neither_shown_nor_graded(tmp_path, monkeypatch):
    """Sandboxed code may name a file with any bytes: in the next prompts and the outcome it made
    the transcript writer raise (the whole run died) and the tokenizer too."""
    scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=2)
    code = REPRO_TEST + "\n\ndef test_odd_name():\n    open(b'textkit/\\xff.py', 'w').write('x = 1')\n"
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies.update(
        reviewer=PythonPolicy(lambda r: '{"verdict": "request_changes"}'),
        tester=PythonPolicy(lambda r: json.dumps({"path": "tests/test_repro.py", "code": code})),
    )
    (ep,) = run(team, policies, tmp_path).episodes  # writes the transcript
    assert ep.status == "ok", ep.error
    assert ep.outcome["rounds"] == 2 and ep.outcome["ignored_changes"] == ["tests/test_repro.py"]


@needs_sandbox
def test_a_timed_out_episode_waits_for_its_sandboxed_run_then_removes_its_copy(tmp_path, monkeypatch):
    """The episode's timeout cannot stop a sandboxed run, which goes on writing in the copy: one
    removed under it was left behind, half deleted."""
    folder = scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=1, sandbox="{timeout_s: 3}")
    spam = ("import os\n\ndef test_spam():\n    i = 0\n    while True:\n"
            "        os.makedirs(f'junk/d{i % 20}', exist_ok=True)\n        open(f'junk/d{i % 20}/f{i}', 'w').close()\n"
            "        i += 1\n")
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies["tester"] = PythonPolicy(lambda r: json.dumps({"path": "tests/test_spam.py", "code": spam}))
    options = RunOptions(episodes=1, seed=0, out_dir=tmp_path / "run", progress=False, episode_timeout_s=1)
    (ep,) = asyncio.run(run_team(team, policies, options)).episodes
    assert ep.status == "timeout"
    assert list(folder.iterdir()) == []


@needs_sandbox
def test_folders_nested_past_the_recursion_limit_are_graded_and_removed(tmp_path, monkeypatch):
    """os.walk and shutil.rmtree recurse (Python 3.11): a test nesting 1500 folders made the
    episode an error (RecursionError) and left its copies behind."""
    folder = scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=1)
    deep = REPRO_TEST + "\n\ndef test_deep():\n    import os\n    for _ in range(1500):\n        os.mkdir('d')\n        os.chdir('d')\n"
    policies = build_policies(team, {n: Binding("builtin", "stub") for n in team.roles}, None)
    policies["tester"] = PythonPolicy(lambda r: json.dumps({"path": "tests/test_repro.py", "code": deep}))
    (ep,) = run(team, policies, tmp_path).episodes
    assert ep.status == "ok", ep.error
    assert ep.outcome["ignored_changes"] == ["tests/test_repro.py"]
    assert list(folder.iterdir()) == []


def test_whatever_a_run_left_at_the_report_path_is_not_trusted(tmp_path):
    """A team's test made the junit report's path a folder (the next run raised IsADirectoryError:
    the episode an error) or a link to a host file (read as root, and taken for the report)."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    (work / REPORT_FILE).mkdir()
    g = run_tests(task, work, subprocess_runner, ["tests"], [])
    assert not g.crashed and g.passed == g.total > 0
    hidden = "tests/hidden/test_hidden_slug.py::test_x"
    forged = write(tmp_path / "forged.xml", '<testsuite><testcase file="tests/hidden/test_hidden_slug.py" name="test_x"/></testsuite>')

    def linking_runner(argv, workdir, timeout_s):  # a run that plants the link and writes no report
        (workdir / REPORT_FILE).unlink(missing_ok=True)
        (workdir / REPORT_FILE).symlink_to(forged)
        return RunOutcome(0, "", "")

    g = run_tests(task, work, linking_runner, ["tests"], [hidden])
    assert g.crashed and g.passed == 0 and g.failed_ids == [hidden]


def test_a_test_file_named_like_an_option_is_run_as_a_file(tmp_path):
    """pytest read the Tester's `-regression.py` as its option `-r egression.py`: the file's failing
    test never ran, and the report said every test passed."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    write(work / "-regression.py", "def test_x():\n    assert False\n")
    g = run_tests(task, work, subprocess_runner, [*task.visible_tests, "-regression.py"], [])
    assert not g.crashed and g.failed_ids == ["-regression.py::test_x"]


def test_a_junit_report_over_a_megabyte_is_read_whole(tmp_path, monkeypatch):
    """The report was read as a source file is, cut at 1 MB: a longer one (long failure texts) did
    not parse, and grading fell back to the -rA summary, which this run does not print."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    hidden = "tests/hidden/test_hidden_slug.py::test_x"
    report = ('<testsuite><testcase file="tests/hidden/test_hidden_slug.py" name="test_x">'
              f'<failure message="long">{"x" * 2_000_000}</failure></testcase></testsuite>')

    def runner(argv, workdir, timeout_s):
        (workdir / REPORT_FILE).write_text(report)
        return RunOutcome(1, "", "")

    g = run_tests(task, work, runner, ["tests"], [hidden])
    assert not g.crashed and g.failed_ids == [hidden]
    monkeypatch.setattr(grading, "REPORT_BYTES", 1_000_000)  # but not past the cap: a writer may write for ever
    assert run_tests(task, work, runner, ["tests"], [hidden]).crashed


def test_a_tests_first_failure_is_the_one_kept(tmp_path):
    """A failing test whose teardown errors too is two entries of one id in the report; neither
    the second nor a later passing entry of the same id stands in for the failure."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    hidden = "tests/hidden/test_hidden_slug.py::test_x"
    case = '<testcase file="tests/hidden/test_hidden_slug.py" name="test_x">{}</testcase>'
    report = "<testsuite>" + "".join(case.format(c) for c in ('<failure message="in call"/>',
                                                              '<error message="in teardown"/>', "")) + "</testsuite>"

    def runner(argv, workdir, timeout_s):
        (workdir / REPORT_FILE).write_text(report)
        return RunOutcome(1, "", "")

    g = run_tests(task, work, runner, ["tests"], [hidden])
    assert not g.crashed and [(o.id, o.status, o.message) for o in g.outcomes] == [(hidden, "failed", "in call")]


def test_a_report_its_exit_code_belies_is_a_crash(tmp_path):
    """Every hidden test passed by the report, yet pytest exited 1 (some failed): the report is not
    pytest's, and grading it would pay for tests that failed."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    hidden = task.hidden_test_ids()
    cases = "".join(f'<testcase file="tests/hidden/test_hidden_slug.py" name="{tid.split("::")[1]}"/>' for tid in hidden)

    def runner(argv, workdir, timeout_s):
        (workdir / REPORT_FILE).write_text(f"<testsuite>{cases}</testsuite>")
        return RunOutcome(1, "", "")

    g = run_tests(task, work, runner, ["tests"], hidden)
    assert g.crashed and g.passed == 0 and g.failed_ids == hidden


def test_a_hidden_test_that_errors_fails_alone(tmp_path):
    """A test whose fixture errors makes pytest exit 1, as a failure does: the run is graded, not a
    crash that fails the hidden tests that passed too."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    first, *rest = hidden = task.hidden_test_ids()
    case = '<testcase file="tests/hidden/test_hidden_slug.py" name="{}">{}</testcase>'
    cases = case.format(first.split("::")[1], '<error message="fixture broke"/>')
    cases += "".join(case.format(tid.split("::")[1], "") for tid in rest)

    def runner(argv, workdir, timeout_s):
        (workdir / REPORT_FILE).write_text(f"<testsuite>{cases}</testsuite>")
        return RunOutcome(1, "", "")

    g = run_tests(task, work, runner, ["tests"], hidden)
    assert rest and not g.crashed and g.passed == len(rest) and g.failed_ids == [first]


def test_a_skipped_hidden_test_earns_nothing(tmp_path):
    """Code under test can skip the hidden tests (raise pytest's Skipped): not a fix."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    hidden = task.hidden_test_ids()
    cases = "".join(f'<testcase file="tests/hidden/test_hidden_slug.py" name="{tid.split("::")[1]}">'
                    '<skipped message="skipped"/></testcase>' for tid in hidden)

    def runner(argv, workdir, timeout_s):
        (workdir / REPORT_FILE).write_text(f"<testsuite>{cases}</testsuite>")
        return RunOutcome(0, "", "")

    g = grade(task, work, runner)
    assert not g.crashed and g.total == len(hidden) and g.passed == 0 and g.fraction == 0.0


def test_a_hidden_test_the_report_leaves_out_counts_as_not_run(tmp_path):
    """A report of one hidden test's pass, the others unreported: a grade over that one alone
    would be 1.0."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    first, *rest = hidden = task.hidden_test_ids()
    report = f'<testsuite><testcase file="tests/hidden/test_hidden_slug.py" name="{first.split("::")[1]}"/></testsuite>'

    def runner(argv, workdir, timeout_s):
        (workdir / REPORT_FILE).write_text(report)
        return RunOutcome(0, "", "")

    g = run_tests(task, work, runner, ["tests"], hidden)
    assert rest and not g.crashed and g.passed == 1 and g.total == len(hidden) and g.failed_ids == rest
    assert {o.message for o in g.outcomes if not o.ok} == {"not run"}


def test_made_up_tests_in_the_report_earn_nothing(tmp_path):
    """Code under test can add made-up tests to the report (at exit, over pytest's): each counted
    as a passed hidden test, so 200 of them scored 0.98 with every real hidden test failing. A
    name that only starts with a hidden test's (``test_x_too`` beside ``test_x``) is made up too."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    hidden = task.hidden_test_ids()
    case = '<testcase file="tests/hidden/test_hidden_slug.py" name="{}">{}</testcase>'
    cases = "".join(case.format(tid.split("::")[1], '<failure message="no"/>') for tid in hidden)
    cases += "".join(case.format(f"test_made_up_{i}", "") for i in range(200))
    cases += "".join(case.format(tid.split("::")[1] + "_too", "") for tid in hidden)

    def runner(argv, workdir, timeout_s):
        (workdir / REPORT_FILE).write_text(f"<testsuite>{cases}</testsuite>")
        return RunOutcome(1, "", "")

    g = grade(task, work, runner)
    assert not g.crashed and g.passed == 0 and g.failed_ids == hidden


def test_a_report_written_over_pytests_at_exit_is_a_crash(tmp_path):
    """A graded module can write an all-passed report at exit, over the one pytest wrote: it was
    taken (1.0 for the buggy code), though pytest's exit code 1 said that tests had failed."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "work")
    forge = "import atexit\n\n\n@atexit.register\ndef _forge():\n" + textwrap.indent(FAKE_PYTEST, "    ")
    (work / "textkit/slug.py").write_text((work / "textkit/slug.py").read_text() + "\n\n" + forge)
    g = grade_work(task, work)
    assert g.exit_code == 1 and g.crashed and g.passed == 0 and g.ignored == []


def test_a_report_a_graded_module_writes_at_exit_is_not_taken(tmp_path):
    """A report file that code under test rewrote at exit was taken: pytest's failures kept (so
    that the exit code agrees) and 200 made-up cases of a hidden test that passes scored 0.98."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "work")
    case = '<testcase file="tests/hidden/test_hidden_slug.py" name="{}">{}</testcase>'
    cases = "".join(case.format(tid.split("::")[1], '<failure message="no"/>') for tid in task.hidden_test_ids())
    cases += "".join(case.format(f"test_ascii_unchanged[{i}]", "") for i in range(200))
    forge = f"import atexit, pathlib\natexit.register(pathlib.Path({REPORT_FILE!r}).write_text, {'<testsuite>' + cases + '</testsuite>'!r})\n"
    (work / "textkit/slug.py").write_text((work / "textkit/slug.py").read_text() + "\n" + forge)
    g = grade_work(task, work)
    assert g.exit_code == 1 and g.crashed and g.passed == 0


def test_a_writer_the_run_left_behind_does_not_hold_up_grading(tmp_path):
    """A detached process that the run left writing to the report for ever (the unsandboxed
    runners kill only the run's process group) kept grading reading it for ever."""
    import threading

    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    hidden = "tests/hidden/test_hidden_slug.py::test_x"
    writers = []

    def leaving_runner(argv, workdir, timeout_s):
        writers.append(subprocess.Popen(["sh", "-c", f"while :; do echo junk; done > {REPORT_FILE}"],
                                        cwd=workdir, start_new_session=True))
        return RunOutcome(1, "", "")

    graded = []
    grader = threading.Thread(target=lambda: graded.append(run_tests(task, work, leaving_runner, ["tests"], [hidden])),
                              daemon=True)
    try:
        grader.start()
        grader.join(60)  # a hang, not a speed: it returns at once
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
    assert graded and graded[0].crashed and graded[0].failed_ids == [hidden]


def test_a_module_turned_into_a_folder_is_graded_not_a_crash(tmp_path):
    """Sandboxed code can replace textkit/slug.py by a folder holding x.py: the fresh copy could
    not make that folder, and grading raised FileExistsError (the episode an error, ungraded)."""
    task = load_task(SLUG)
    work = copy_repo(task, tmp_path / "repo")
    (work / "textkit/slug.py").unlink()
    write(work / "textkit/slug.py/x.py", "x = 1\n")
    g = grade_work(task, work, subprocess_runner)
    assert g.ignored == ["textkit/slug.py/x.py"] and 0 < g.passed < g.total
    assert not graded_path(task, "textkit/slug.py/x.py")


def test_rounds_past_max_turns_are_refused_at_load(tmp_path, monkeypatch):
    """22 rounds take 1 + 3 x 22 = 67 turns: past max_turns 64 an unapproved fix stopped unfinished."""
    from orchestrator.errors import ConfigError

    root = Path(__file__).resolve().parents[2]
    recipe = (root / "recipes/issue_fix.yaml").read_text()
    assert "max_rounds: 3" in recipe
    (tmp_path / "roles").symlink_to(root / "roles")  # the recipe's prompts: ../roles/prompts/...
    monkeypatch.chdir(root)  # its tasks: relative to the current folder
    (tmp_path / "recipes").mkdir()
    path = tmp_path / "recipes" / "team.yaml"
    path.write_text(recipe.replace("max_rounds: 3", "max_rounds: 21"))
    assert load_team(path).env_config.turns_needed() == 64
    path.write_text(recipe.replace("max_rounds: 3", "max_rounds: 22"))
    with pytest.raises(ConfigError, match="a whole game can take 67 turns and max_turns is 64"):
        load_team(path)


@needs_sandbox
@pytest.mark.parametrize("end", ["tester_reward raises", "cancelled"])
def test_the_episode_ends_only_once_grading_has(tmp_path, monkeypatch, end):
    """Grading and the Tester's reward run side by side: the tester's raising, or a cancel (an
    episode's timeout) once it had ended, ended the episode, whose copy was removed under the
    grading still running in it."""
    import random

    import orchestrator.issue_fix.env as env_module

    scratch(monkeypatch, tmp_path)
    team = team_for(tmp_path, max_rounds=1)
    env = team.make_env({"dir": str(SLUG)}, random.Random(0))
    env.test, started, graded = REPRO, threading.Event(), threading.Event()

    def grading(issue, workdir, runner):  # a run the episode cannot stop
        started.set()
        time.sleep(0.3)
        graded.set()
        return grade_work(issue, workdir, subprocess_runner)

    def reward(*args):
        if end == "tester_reward raises":
            raise RuntimeError("tester down")
        return 0.0, ""

    monkeypatch.setattr(env_module, "grade_work", grading)
    monkeypatch.setattr(env_module, "tester_reward", reward)

    async def episode():
        finish = asyncio.ensure_future(env._finish())
        await asyncio.to_thread(started.wait)
        if end == "cancelled":
            finish.cancel()
        with pytest.raises((RuntimeError, asyncio.CancelledError)):
            await finish
        assert graded.is_set()  # the episode ended with its grading, not before
        await env.close()

    asyncio.run(episode())
    assert not env._tmp.exists()


@needs_sandbox
def test_the_env_shows_source_first_within_its_budget_and_refuses_the_graders_place(tmp_path, monkeypatch):
    import os
    import random

    scratch(monkeypatch, tmp_path)
    env = team_for(tmp_path, max_rounds=1).make_env({"dir": str(SLUG)}, random.Random(0))
    try:
        assert env.recipients("coder") == ["planner", "reviewer", "tester"]
        first, second = env._files()[:2]
        env.config = env.config.model_copy(update={"max_file_chars": len(first["text"])})
        assert env._files()[:2] == [first, {"path": second["path"], "text": "(not shown: too much text)"}]  # fits exactly: whole
        env.config = env.config.model_copy(update={"max_file_chars": len(first["text"]) + 5})
        files = env._files()
        paths = [f["path"] for f in files]
        assert paths == sorted(paths, key=lambda p: (p.startswith("tests/"), p)) and paths[-1].startswith("tests/")
        assert files[0] == first and files[1]["text"] == second["text"][:5] + "\n... (cut)"
        assert {f["text"] for f in files[2:]} == {"(not shown: too much text)"}
        assert env._write_test("tests/hidden/test_x.py", REPRO_TEST) == "tests/hidden/test_x.py is reserved for the graders' tests"
        os.mkfifo(env.workdir / "tests/test_fifo.py")  # what a sandboxed run may leave at the Tester's path
        reader = os.open(env.workdir / "tests/test_fifo.py", os.O_RDONLY | os.O_NONBLOCK)  # a write would not block
        try:
            assert env._write_test("tests/test_fifo.py", REPRO_TEST) is None
        finally:
            os.close(reader)
        assert is_regular(env.workdir / "tests/test_fifo.py") and (env.workdir / "tests/test_fifo.py").read_text() == REPRO_TEST
        (env.workdir / "tests/test_fifo.py").unlink()  # as a sandboxed run can: named to pytest, it crashed the run
        report = asyncio.run(env._run_team_tests(None))
        assert report["passed"] and "crashed" not in report["summary"], report
    finally:
        asyncio.run(env.close())


def test_a_run_with_no_tests_has_not_passed():
    report = _report(Grade(task_id="t", outcomes=[], exit_code=0), 100)
    assert (report["passed"], report["summary"]) == (False, "no tests ran")


def test_max_output_chars_of_zero_shows_none_of_the_test_output():
    """The test output is cut from its tail: at 0, ``text[-0:]`` kept the whole of it in every prompt."""
    g = Grade(task_id="t", outcomes=[], exit_code=1, crashed=True, log="collected 3 items\nE   boom\n" * 50)
    assert _report(g, 0)["output"] == "(cut) ...\n"
    assert _report(g, 8)["output"] == "(cut) ...\n   boom\n"


def driven_env(tmp_path, monkeypatch, passes: list[bool], max_rounds: int = 3, on_invalid: str = "continue"):
    """An env whose sandboxed work is faked: the team's test runs pass as ``passes`` says, grading
    passes 1 hidden test of 2 and the Tester's check pays 0.25."""
    import random

    import orchestrator.issue_fix.env as env_module
    from orchestrator.issue_fix.grading import TestOutcome

    runs = iter(passes)
    monkeypatch.setattr(env_module, "run_tests", lambda *args: Grade(
        task_id="t", outcomes=[TestOutcome("tests/test_x.py::t", "passed" if next(runs) else "failed")], exit_code=0))
    monkeypatch.setattr(env_module, "grade_work", lambda *args: Grade(
        task_id="t", outcomes=[TestOutcome("h::a", "passed"), TestOutcome("h::b", "failed")], exit_code=1))
    monkeypatch.setattr(env_module, "tester_reward", lambda *args: (0.25, "faked"))
    scratch(monkeypatch, tmp_path)
    env = team_for(tmp_path, max_rounds=max_rounds).make_env({"dir": str(SLUG)}, random.Random(0))
    env.config = env.config.model_copy(update={"on_invalid": on_invalid})
    return env


def drive(env, replies: dict[str, list]) -> list:
    """Play ``replies`` (each role's contents in turn; None: an invalid turn): the roles that acted
    and each step's result."""
    from orchestrator.messages import Message

    played = []
    while (role := env.next_role()) is not None:
        content = replies[role].pop(0)
        message = Message(id="e", episode="e", turn=len(played), sender=role, recipients=[], content=content,
                          raw="", valid=content is not None)
        played.append((role, asyncio.run(env.step(role, message))))
    return played


def test_rounds_restart_at_the_coder_and_each_role_gets_its_own_process_reward(tmp_path, monkeypatch):
    """An approval with failing tests, then passing tests without one, go on to the next round; the
    process rewards go each to its own role (planner F1 2/3, coder 1 edit of 2, reviewer right to
    turn down half a fix, tester the check's 0.25) and every role gets the outcome at the end alone."""
    env = driven_env(tmp_path, monkeypatch, passes=[False, True, True])
    missing = {**WRONG_FIX, "search": "no such text"}
    played = drive(env, {
        "planner": [{**PLAN, "files": ["textkit/slug.py", "README"]}],
        "coder": [{"edits": [WRONG_FIX, missing]}, {"edits": []}, {"edits": []}],
        "reviewer": [{"verdict": "approve"}, {"verdict": "request_changes"}, {"verdict": "request_changes"}],
        "tester": [REPRO] * 3,
    })
    try:
        assert [role for role, _ in played] == ["planner"] + ["coder", "reviewer", "tester"] * 3
        assert all(not result.rewards and not result.done for _, result in played[:-1])
        assert played[-1][1].done and played[-1][1].rewards == dict.fromkeys(env.roles, 0.5)
        out = env.outcome()
        assert (out["rounds"], out["approved"], out["tests_passed"]) == (3, False, True)
        assert (out["edits_applied"], out["edits_total"]) == (1, 2)
        assert out["process"] == {"planner": pytest.approx(2 / 3), "coder": 0.5, "reviewer": 1.0, "tester": 0.25}
    finally:
        asyncio.run(env.close())


def test_an_approval_with_passing_tests_ends_the_round(tmp_path, monkeypatch):
    env = driven_env(tmp_path, monkeypatch, passes=[True])
    played = drive(env, {"planner": [PLAN], "coder": [{"edits": []}], "reviewer": [{"verdict": "approve"}],
                         "tester": [REPRO]})
    try:
        assert len(played) == 4 and played[-1][1].done and env.outcome()["rounds"] == 1
        assert env.outcome()["approved"] is True and env.outcome()["process"]["reviewer"] == 0.0  # half a fix
    finally:
        asyncio.run(env.close())


@pytest.mark.parametrize("on_invalid, roles", [
    ("end", ["planner", "coder", "reviewer"]),
    ("continue", ["planner", "coder", "reviewer", "tester"]),
])
def test_on_invalid_end_ends_the_episode_at_the_invalid_turn(tmp_path, monkeypatch, on_invalid, roles):
    env = driven_env(tmp_path, monkeypatch, passes=[True], max_rounds=1, on_invalid=on_invalid)
    played = drive(env, {"planner": [PLAN], "coder": [{"edits": []}], "reviewer": [None], "tester": [REPRO]})
    try:
        assert [role for role, _ in played] == roles and env.next_role() is None
        assert played[-1][1].done and played[-1][1].rewards == dict.fromkeys(env.roles, 0.5)
        assert env.outcome()["approved"] is None and env.outcome()["process"]["reviewer"] == 0.0
    finally:
        asyncio.run(env.close())


def test_outcome_metrics_count_graded_episodes_only():
    """An episode stopped at max_turns is never graded: its outcome has no `outcome`."""
    from orchestrator.issue_fix.env import IssueFixEnv

    outcomes = [{"outcome": 1.0, "approved": True}, {"outcome": 1.0, "approved": False},
                {"outcome": 0.5, "approved": False}, {"task": "t", "rounds": 2}]
    assert IssueFixEnv.outcome_metrics(None, outcomes) == {
        "solved_rate": pytest.approx(2 / 3), "reviewer_accepts_right": 0.5, "reviewer_rejects_wrong": 1.0,
        "reviewer_balanced_accuracy": 0.75}
    assert IssueFixEnv.outcome_metrics(None, [{"task": "t", "rounds": 2}]) == {}
