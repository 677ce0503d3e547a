"""code_pair: the Coder's function runs on the hidden tests' inputs in the sandbox, the Tester's
example is checked against the reference, and a function cannot forge its way to a pass."""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest
from play import Script, play, team
from support import needs_sandbox

from sandboxes import cgroup

PLUS3 = {"spec": "Return x plus 3.", "reference": "x + 3", "tests": [[1, 4], [10, 13], [-2, 1], [0, 3]]}
REVERSE = {"spec": "Return the string x reversed.", "reference": "x[::-1]", "tests": [["abc", "cba"], ["a", "a"]]}


def code(body: str) -> dict:
    return {"code": f"def f(x): return {body}"}


def episode(tmp_path, task, example, body):
    t = team("code_pair", tasks=[task])
    (ep,) = play(t, {"tester": Script(example), "coder": Script(body)}, tmp_path).episodes
    assert ep.status == "ok" and [turn.role for turn in ep.turns] == ["tester", "coder"]
    return ep


@needs_sandbox
def test_a_right_function_and_a_right_example(tmp_path):
    ep = episode(tmp_path, PLUS3, {"example": "f(2) == 5"}, code("x + 3"))
    assert ep.outcome["passed"] == ep.outcome["total"] == 4 and ep.outcome["example_correct"] is True
    assert ep.rewards == {"tester": 1.0, "coder": 1.0}
    assert ep.outcome["process"] == {"tester": 1.0, "coder": 1.0}


@needs_sandbox
def test_partial_credit_and_a_wrong_example(tmp_path):
    ep = episode(tmp_path, PLUS3, {"example": "f(2) == 6"}, code("abs(x) + 3"))  # wrong for -2 only
    assert (ep.outcome["passed"], ep.outcome["total"]) == (3, 4)
    assert ep.rewards == {"tester": 0.75, "coder": 0.75} and ep.outcome["process"]["tester"] == 0.0


@needs_sandbox
def test_the_coder_sees_the_testers_example(tmp_path):
    coder = Script(code("x[::-1]"))
    t = team("code_pair", tasks=[REVERSE])
    (ep,) = play(t, {"tester": Script({"example": "f('ab') == 'ba'"}), "coder": coder}, tmp_path).episodes
    prompt = coder.requests[0].messages[-1]["content"]
    assert "f('ab') == 'ba'" in prompt and ep.outcome["example_correct"] is True and ep.rewards["coder"] == 1.0


@pytest.mark.parametrize("example", ["f(x) == x + 3", "f(2) == 5 == 5", "g(2) == 5", "f(2, 3) == 5", "f(2, y=1) == 5",
                                     "f(2) != 5", "f(2) == 6"])
def test_only_a_literal_example_that_holds_is_right(example):
    from orchestrator.envs.code_pair import CodePairEnv

    env = object.__new__(CodePairEnv)  # the check needs only the task and the example
    env.task, env.example = PLUS3, example
    assert env._example_correct() is False
    env.example = "f(2) == 5"
    assert env._example_correct() is True


@needs_sandbox
def test_a_bool_is_not_a_number(tmp_path):
    """JSON's true is not 1, though Python's True == 1: a function or an example that answers
    with the wrong type is wrong."""
    mod2 = {"spec": "Return x modulo 2.", "reference": "x % 2", "tests": [[5, 1], [8, 0]]}
    ep = episode(tmp_path, mod2, {"example": "f(5) == True"}, code("x % 2 == 1"))
    assert ep.outcome["passed"] == 0 and ep.outcome["example_correct"] is False
    even = {"spec": "Return True if x is even, else False.", "reference": "x % 2 == 0", "tests": [[4, True], [3, False]]}
    ep = episode(tmp_path, even, {"example": "f(4) == 1"}, code("1 - x % 2"))
    assert ep.outcome["passed"] == 0 and ep.outcome["example_correct"] is False


@needs_sandbox
@pytest.mark.parametrize("body, error", [
    ("x +", "SyntaxError"),
    ("sum(iter(int, 1))", "timed out"),   # never returns: the sandbox's deadline ends it
    ("__import__('os')._exit(0)", "the check failed"),
    pytest.param("[bytearray(1 << 20) for _ in iter(int, 1)]", "out of memory (the sandbox allows 256 MB)",  # was "exit 137"
                 marks=pytest.mark.skipif(not cgroup.available(), reason="no memory cgroup: a MemoryError instead")),
])
def test_a_broken_function_scores_zero(tmp_path, body, error):
    task = {**PLUS3, "tests": PLUS3["tests"][:1]}
    t = team("code_pair", tasks=[task], sandbox={"backend": "auto", "timeout_s": 2, "memory_mb": 256})
    (ep,) = play(t, {"tester": Script({"example": "f(1) == 4"}), "coder": Script(code(body))}, tmp_path).episodes
    assert ep.outcome["passed"] == 0 and error in ep.outcome["error"] and ep.rewards["coder"] == 0.0


@needs_sandbox
def test_a_function_that_raises_on_one_input_fails_that_one_alone(tmp_path):
    ep = episode(tmp_path, PLUS3, {"example": "f(2) == 5"}, code("x + 3 + 0 // (x + 2)"))  # -2, the third, raises
    assert (ep.outcome["passed"], ep.outcome["error"], ep.rewards["coder"]) == (3, None, 0.75)
    assert ep.outcome["spec"] == PLUS3["spec"]


@needs_sandbox
def test_a_forged_report_does_not_pass(tmp_path):
    """The function may print what it likes, even a line like the checker's, and exit before the
    checker reports: the host compares the values with outputs the sandbox never saw."""
    forge = """print("\\n@@rolecast-check "+chr(123)+'"results":[[1,"99"]]'+chr(125))or exit()"""  # no braces: the schema
    ep = episode(tmp_path, {**PLUS3, "tests": PLUS3["tests"][:1]}, {"example": "f(1) == 4"}, code(forge))
    assert ep.outcome["error"] is None  # the host did read the forged line (a failed check says why)...
    assert ep.outcome["passed"] == 0 and ep.rewards["coder"] == 0.0  # ...and it passed nothing


@needs_sandbox
def test_a_forged_report_nested_too_deep_scores_zero(tmp_path):
    """json.loads raised RecursionError on a forged line of 99999 '[': the episode was an error."""
    forge = "print('\\n@@rolecast-check '+'['*99999)or exit()"
    ep = episode(tmp_path, {**PLUS3, "tests": PLUS3["tests"][:1]}, {"example": "f(1) == 4"}, code(forge))
    assert ep.outcome["passed"] == 0 and ep.rewards["coder"] == 0.0 and "the check failed" in ep.outcome["error"]


@needs_sandbox
def test_a_function_cannot_read_the_hidden_tests_from_the_host(tmp_path):
    """The sandbox saw the host's / read-only: a function could look its answers up in the recipe's
    tasks file, or the run's config.yaml, wherever they were on the disk outside /tmp."""
    recipe_dir = Path(tempfile.mkdtemp(dir="/var/tmp"))  # stands for the user's project folder
    try:
        (recipe_dir / "t").write_text(repr(dict(PLUS3["tests"])))  # the answers, in few characters of code
        subprocess.run(["chmod", "-R", "a+rX", str(recipe_dir)], check=True)
        look_up = f"eval(open('{recipe_dir}/t').read())[x]"
        ep = episode(tmp_path, PLUS3, {"example": "f(2) == 5"}, code(look_up))
    finally:
        subprocess.run(["rm", "-rf", "--", str(recipe_dir)], check=True)
    assert ep.outcome["passed"] == 0 and ep.rewards["coder"] == 0.0


@needs_sandbox
def test_a_full_tmpdir_is_an_episode_error_naming_the_folder(tmp_path, small_disk, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(small_disk))  # where the episode's workdir is made
    (small_disk / "rest").write_bytes(bytes(16 * 1024))  # the last free blocks
    t = team("code_pair", tasks=[{**PLUS3, "tests": [[1, 4]] * 3000}])  # a job.json of some blocks
    (ep,) = play(t, {"tester": Script({"example": "f(1) == 4"}), "coder": Script(code("x + 3"))}, tmp_path).episodes
    assert ep.status == "error" and "No space left on device" in ep.error and str(small_disk) in ep.error, ep.error


@needs_sandbox
def test_a_function_that_prints_past_the_output_limit_is_told_so(tmp_path):
    """The checker's report comes after what the function printed, and the sandbox keeps the first
    1 MB: a right function that printed more scored 0 with "the check failed (exit 0)"."""
    ep = episode(tmp_path, {**PLUS3, "tests": PLUS3["tests"][:1]}, {"example": "f(1) == 4"}, code("print('a'*1500000)or x + 3"))
    assert ep.outcome["passed"] == 0 and "printed more than the sandbox keeps (1000000 bytes)" in ep.outcome["error"]


@needs_sandbox
def test_a_function_that_nests_folders_deep_is_scored_and_cleaned_up(tmp_path, monkeypatch):
    """The function may nest folders thousands deep in its workdir: rmtree's recursion raised,
    the episode was an error instead of a score, and the workdir stayed behind."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the episode's workdir is made
    monkeypatch.setattr("tempfile.tempdir", None)
    deep = "[(o.mkdir('d'),o.chdir('d'))for o in[__import__('os')]*3000]"
    ep = episode(tmp_path, {**PLUS3, "tests": PLUS3["tests"][:1]}, {"example": "f(1) == 4"}, code(deep))
    assert ep.outcome["passed"] == 0 and ep.rewards["coder"] == 0.0
    assert not list(tmp_path.rglob("rolecast-code-pair-*"))


def test_tasks_need_a_spec_a_reference_and_tests(tmp_path):
    t = team("code_pair", tasks=[{"spec": "Return x."}])
    (ep,) = play(t, {"tester": Script({"example": "f(1) == 1"}), "coder": Script(code("x"))}, tmp_path).episodes
    assert ep.status == "error" and ep.error == "ValueError: task reference: required key is missing"
    t = team("code_pair", tasks=[{**PLUS3, "reference": "return x + 3"}])  # a statement, not an expression
    (ep,) = play(t, {"tester": Script({"example": "f(1) == 4"}), "coder": Script(code("x + 3"))}, tmp_path).episodes
    assert ep.status == "error" and ep.error.startswith("ValueError: task reference: not a Python expression of x")


def test_values_are_the_same_only_as_json_values_are():
    """A list one short, a dict with a key more, or a true nested where 1 is due is a wrong result."""
    from orchestrator.envs.code_pair import same

    assert same([1, 2], [1, 2]) and same({"a": [1, {"b": "c"}]}, {"a": [1, {"b": "c"}]}) and same(2, 2.0)
    assert not same([1, 2], [1, 2, 3]) and not same([1, 2, 3], [1, 2])
    assert not same({"a": 1}, {"a": 1, "b": 2}) and not same({"a": True}, {"a": 1}) and not same([True], [1])


def test_a_tuple_is_the_json_array_a_list_is():
    """A reference that returns a tuple (divmod) failed the Tester's right example with a list in
    it, and a task written in Python with a tuple expected failed every right function."""
    from orchestrator.envs.code_pair import CodePairEnv, same

    env = object.__new__(CodePairEnv)
    env.task = {"spec": "Return divmod(x, 3).", "reference": "divmod(x, 3)", "tests": [[7, [2, 1]]]}
    for example in ("f(7) == [2, 1]", "f(7) == (2, 1)"):
        env.example = example
        assert env._example_correct() is True
    assert same([2, [1]], (2, (1,))) and not same([2, 1], (2, 1, 0)) and not same([True], (1,))


def test_the_roles_are_different_and_the_coders_schema_has_code(tmp_path):
    """A coder role of another shape failed every episode with KeyError: 'code'."""
    from play import ROOT

    from orchestrator.envs.code_pair import CodePairConfig
    from orchestrator.errors import ConfigError
    from orchestrator.team import load_team

    with pytest.raises(ValueError, match="tester and coder must be different roles"):
        CodePairConfig(tester="x", coder="x")
    recipe = (ROOT / "recipes/code_pair.yaml").read_text().replace("{use: function_coder, name: coder}",
                                                                   "{use: example_tester, name: coder}")
    (tmp_path / "team.yaml").write_text(recipe.replace("tasks: functions/train.jsonl", f"tasks: [{PLUS3}]"))
    with pytest.raises(ConfigError, match="CodePairEnv reads field\\(s\\) code of the messages of role 'coder'"):
        load_team(tmp_path / "team.yaml")


def test_a_message_without_the_example_or_the_function_scores_nothing(tmp_path):
    """For roles whose schema leaves them optional: a valid ``{"note": ...}`` ended the episode as an
    error (KeyError: 'example'), not as no example and no function."""
    import dataclasses

    t = team("code_pair", tasks=[PLUS3])
    loose = {"type": "object", "properties": {"example": {"type": "string"}, "code": {"type": "string"},
                                              "note": {"type": "string"}}}
    t = dataclasses.replace(t, roles={n: dataclasses.replace(r, schema=loose) for n, r in t.roles.items()})
    (ep,) = play(t, {"tester": Script({"note": "x"}), "coder": Script({"note": "y"})}, tmp_path).episodes
    assert ep.status == "ok", ep.error
    assert (ep.outcome["example_correct"], ep.outcome["passed"], ep.outcome["error"]) == (False, 0, "no valid function")
    assert ep.rewards == {"tester": 0.0, "coder": 0.0}
