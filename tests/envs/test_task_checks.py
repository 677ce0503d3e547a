"""Tasks are checked against their protocol's task model when a team loads: a misspelt key, a
wrong type or a value the protocol cannot use is one ``FILE:LINE: KEY: problem`` line, in the
file the task came from (the team file, or its YAML or JSON-lines tasks file)."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from support import ERROR_LINE, ROOT, write

RECIPES = ROOT / "recipes"


def recipe(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """A copy of a shipped recipe with ``old`` replaced, beside links to what its paths reach."""
    text = (RECIPES / f"{name}.yaml").read_text()
    assert old in text, f"{old!r} not in {name}.yaml"
    for link, target in (("recipes/functions", RECIPES / "functions"), ("roles", ROOT / "roles")):
        if not (tmp_path / link).exists():
            (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / link).symlink_to(target)
    return write(tmp_path / "recipes" / f"{name}.yaml", text.replace(old, new))


GUESS_TASKS = "tasks: [{secret: 1}, {secret: 2},"
# (id, recipe, old, new, file the error names, line, key, words in the problem)
CASES = [
    ("misspelt-key", "guess_number", GUESS_TASKS, "tasks: [{secrt: 1}, {secret: 2},",
     "guess_number.yaml", 31, "tasks[0].secrt", "did you mean 'secret'"),
    ("out-of-range", "guess_number", GUESS_TASKS, "tasks: [{secret: 1}, {secret: 20},",
     "guess_number.yaml", 31, "tasks[1].secret", "outside the protocol's range [1, 16]"),
    ("string-number", "guess_number", GUESS_TASKS, "tasks: [{secret: '1'}, {secret: 2},",
     "guess_number.yaml", 31, "tasks[0].secret", "valid integer"),
    ("eval-task", "guess_number", "eval_tasks: [{secret: 3},", "eval_tasks: [{secret: 0},",
     "guess_number.yaml", 45, "training.eval_tasks[0].secret", "outside"),
    ("no-teacher", "teacher_student", "{domain: smallest}", "{domain: largest_prime}",
     "teacher_student.yaml", 33, "tasks[1].domain", "has no teacher (protocol domains: largest, smallest)"),
    ("two-words", "twenty_questions", "tasks: [{}]", "tasks: [{secret: ice cream}]",
     "twenty_questions.yaml", 20, "tasks[0].secret", "one word"),
    ("topic-not-text", "debate", '{topic: "Remote work is better than office work."}', "{topic: [remote, work]}",
     "debate.yaml", 27, "tasks[3].topic", "valid string"),
    # a debate about "" passed: both debaters and the judge were prompted "Debate topic: " and nothing
    ("topic-empty", "debate", '{topic: "Zoos should be closed."}', '{topic: " "}',
     "debate.yaml", 30, "tasks[6].topic", "the topic is empty"),
    ("topic-missing", "debate", '{topic: "Zoos should be closed."}', '{}',
     "debate.yaml", 30, "tasks[6].topic", "required key is missing"),
    ("issue-dir-missing", "issue_fix", "{dir: tasks/002-paginate-last-page}", "{dir: tasks/002-nowhere}",
     "issue_fix.yaml", 31, "tasks[1].dir", "tasks/002-nowhere/task.yaml: (file): file not found"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_task_is_one_line(case, tmp_path, cli, monkeypatch):
    _, name, old, new, file, line, key, words = case
    monkeypatch.chdir(ROOT)  # issue_fix task dirs are relative to where rolecast runs
    code, _, err = cli("validate", recipe(tmp_path, name, old, new))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    m = ERROR_LINE.match(err.strip())
    assert m and Path(m["file"]).name == file and int(m["line"]) == line and m["key"] == key, err
    assert words in m["problem"], err


def test_a_tasks_file_error_names_that_file_and_line(tmp_path, cli):
    good = (RECIPES / "functions/train.jsonl").read_text().splitlines()[0]
    write(tmp_path / "t.jsonl", f'{good}\n\n{{"spec": "Return x.", "reference": "x +", "tests": [[1, 1]]}}\n')
    code, _, err = cli("validate", recipe(tmp_path, "code_pair", "tasks: functions/train.jsonl", f"tasks: {tmp_path / 't.jsonl'}"))
    m = ERROR_LINE.match(err.strip())
    assert code == 2 and m and m["file"] == str(tmp_path / "t.jsonl") and m["line"] == "3" and m["key"] == "reference", err
    assert "not a Python expression of x" in m["problem"], err

    write(tmp_path / "t.yaml", "- {secret: 3}\n- {secret: 3, secrets: 4}\n- {secret: 99}\n")
    code, _, err = cli("validate", recipe(tmp_path, "guess_number", "eval_tasks: [{secret: 3}, {secret: 6}, {secret: 11}, {secret: 14}]",
                                          f"eval_tasks: {tmp_path / 't.yaml'}"))
    m = ERROR_LINE.match(err.strip())
    assert code == 2 and m and m["file"] == str(tmp_path / "t.yaml") and m["line"] == "3" and m["key"] == "[2].secret", err


def test_keys_the_protocol_does_not_read_are_kept(tmp_path, cli):
    """Prompts and reward plugins may read a task's other keys; only near misses are refused."""
    path = recipe(tmp_path, "guess_number", GUESS_TASKS, "tasks: [{secret: 1, level: easy}, {secret: 2, secrets: 3},")
    code, out, err = cli("validate", path)
    assert code == 0 and "ok" in out, err

    from orchestrator.team import load_team
    assert load_team(path).tasks[0] == {"secret": 1, "level": "easy"}


def test_run_task_flag_is_checked_like_a_task(tmp_path, cli):
    code, _, err = cli("run", RECIPES / "guess_number.yaml", "--task", "17", "--out", tmp_path / "run")
    assert code == 2 and err.strip() == "rolecast: --task 17: secret: outside the protocol's range [1, 16] (got 17)"
    assert not (tmp_path / "run").exists()


def test_a_task_built_in_code_is_checked_by_the_env():
    from orchestrator.team import load_team

    team = load_team(RECIPES / "teacher_student.yaml")
    with pytest.raises(ValueError, match=r"^task domain: domain 'cubes' has no teacher"):
        team.make_env({"domain": "cubes"}, random.Random(0))
    assert team.make_env({}, random.Random(0)).domain in {"largest", "smallest"}


@pytest.mark.parametrize("name, how", [
    ("code_pair", "an invalid example is no example, an invalid function passes no test"),
    ("generate_judge", "an invalid answer is no answer (a wrong one), an invalid verdict a miss"),
    ("teacher_student", "an invalid example is no example, an invalid answer a wrong one"),
    ("propose_solve", "an invalid problem ends the episode, an invalid answer is a wrong one"),
])
def test_on_invalid_end_is_refused_where_the_env_takes_invalid_turns_its_own_way(tmp_path, name, how):
    """These envs never read on_invalid: `end` loaded and every invalid turn went on as before."""
    from orchestrator.errors import ConfigError
    from orchestrator.team import load_team

    path = recipe(tmp_path, name, f"  type: {name}\n", f"  type: {name}\n  on_invalid: end\n")
    with pytest.raises(ConfigError, match=rf"{name}.yaml:\d+: protocol: on_invalid: end is not used here: {re.escape(how)}$"):
        load_team(path)
    assert load_team(recipe(tmp_path, name, f"  type: {name}\n", f"  type: {name}\n  on_invalid: continue\n"))
