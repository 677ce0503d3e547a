"""Hostile input files (YAML bombs, deep nesting, huge files) fail fast with one config error."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from support import ERROR_LINE, write
from orchestrator.errors import ConfigError
from orchestrator.issue_fix.task import TaskFileError, load_task
from orchestrator.policies.replay import ReplayPolicy
from orchestrator.role import load_role
from orchestrator.team import load_team
from orchestrator.yamlfile import MAX_ALIAS_NODES, MAX_DEPTH, MAX_YAML_BYTES, load_json_lines, load_yaml, read_text

ROOT = Path(__file__).resolve().parent.parent
FAST_S = 2.0  # a guard that nothing expands the bomb, not a performance target


def bomb(levels: int = 9) -> str:
    """The "billion laughs": each anchor holds nine aliases of the one before (9**9 leaves)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def assert_fails_fast(load, arg: Path, words: str, file: Path | None = None) -> ConfigError:
    """``load(arg)`` raises a one-line ConfigError naming ``file`` (default ``arg``), quickly."""
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load(arg)
    assert time.monotonic() - started < FAST_S
    assert info.value.file == str(file or arg) and words in info.value.problem, str(info.value)
    assert "\n" not in str(info.value)
    return info.value


def test_billion_laughs_role_is_refused_fast(workspace):
    role = workspace / "echo.yaml"
    role.write_text(role.read_text() + bomb())
    err = assert_fails_fast(load_role, role, "aliases expand to more than")
    assert err.key == "(yaml)" and err.line is not None


def test_billion_laughs_via_cli_is_one_line_exit_2(workspace, cli):
    path = write(workspace / "laughs.yaml", bomb())
    cli("validate", workspace / "team.yaml")  # the first call's imports and plugin discovery are not the bomb's
    started = time.monotonic()
    code, out, err = cli("validate", path)
    assert time.monotonic() - started < FAST_S
    assert code == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1
    m = ERROR_LINE.match(lines[0])
    assert m and m["file"] == str(path) and m["key"] == "(yaml)", lines[0]


def test_recursive_alias_is_refused(tmp_path):
    assert_fails_fast(load_yaml, write(tmp_path / "loop.yaml", "a: &a [1, *a]\n"), "contains it")


def test_aliases_within_the_bound_still_work(tmp_path):
    path = write(tmp_path / "ok.yaml", "base: &b {x: 1, y: [1, 2]}\nc:\n  <<: *b\n  z: 3\nd: *b\n")
    assert load_yaml(path).data == {"base": {"x": 1, "y": [1, 2]}, "c": {"x": 1, "y": [1, 2], "z": 3},
                                    "d": {"x": 1, "y": [1, 2]}}


@pytest.mark.parametrize("text", [
    "x: " + "[" * 5000 + "]" * 5000 + "\n",  # flow style: would hit Python's recursion limit
    "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5)) + "  " * (MAX_DEPTH + 5) + "v\n",
], ids=["flow", "block"])
def test_deep_nesting_is_refused(tmp_path, text):
    err = assert_fails_fast(load_yaml, write(tmp_path / "deep.yaml", text), f"nested deeper than {MAX_DEPTH}")
    assert err.line is not None


def test_nesting_up_to_the_bound_loads_and_one_more_level_is_refused(tmp_path):
    """YAML and JSON lines count the same levels: the mapping, then each list (the innermost empty)."""
    for lists, fits in ((MAX_DEPTH - 1, True), (MAX_DEPTH, False)):
        nested = "[" * lists + "]" * lists
        yaml_file, jsonl = write(tmp_path / "n.yaml", f"x: {nested}\n"), write(tmp_path / "n.jsonl", f'{{"x": {nested}}}\n')
        for load, path in ((load_yaml, yaml_file), (load_json_lines, jsonl)):
            if fits:
                load(path)
            else:
                assert_fails_fast(load, path, f"nested deeper than {MAX_DEPTH}")


def test_oversize_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("x: " + "a" * MAX_YAML_BYTES + "\n")
    err = assert_fails_fast(load_yaml, path, "larger than")
    assert err.key == "(file)" and err.problem == "file is larger than 1 MiB"


def test_a_file_at_the_size_cap_is_read_and_one_byte_more_is_refused(tmp_path):
    path = write(tmp_path / "cap.yaml", "x: 1\n")
    assert read_text(path, 5) == "x: 1\n"
    assert_fails_fast(lambda p: read_text(p, 4), path, "larger than")


def test_aliases_that_expand_to_the_bound_load_and_one_node_more_is_refused(tmp_path):
    # an anchor of 1000 nodes (a list and its 999 items), aliased until they add MAX_ALIAS_NODES
    anchor = "a: &a [" + ", ".join(["1"] * 999) + "]\ns: &s 1\n"
    aliases = "b: [" + ", ".join(["*a"] * (MAX_ALIAS_NODES // 1000)) + "]\n"
    load_yaml(write(tmp_path / "fits.yaml", anchor + aliases))
    assert_fails_fast(load_yaml, write(tmp_path / "over.yaml", anchor + aliases + "c: *s\n"), "aliases expand")


def test_a_key_that_is_a_lone_surrogate_is_refused_at_its_line(tmp_path):
    err = assert_fails_fast(load_yaml, write(tmp_path / "k.yaml", 'x: 1\n"k\\udcff": 2\n'), "lone surrogate")
    assert err.line == 2


def test_merged_keys_are_named_at_their_lines_and_a_second_merge_key_is_a_duplicate(tmp_path):
    text = "d: &d {x: 1, y: 2}\ne: &e {x: 3}\nc:\n  <<: [*e, *d]\n  y: 4\n"
    doc = load_yaml(write(tmp_path / "m.yaml", text))
    assert doc.data["c"] == {"x": 3, "y": 4}
    assert doc.lines[("c", "x")] == 2 and doc.lines[("c", "y")] == 5  # the first merged mapping's; the key's own
    err = assert_fails_fast(load_yaml, write(tmp_path / "two.yaml", text + "  <<: *d\n"), "duplicate key")
    assert err.line == 6 and err.key == "c.<<"


def test_tasks_file_bomb_is_named_at_its_own_line(workspace):
    write(workspace / "tasks.yaml", bomb() + "tasks: [{text: x}]\n")
    team = workspace / "team.yaml"
    team.write_text(team.read_text().split("tasks:")[0] + "tasks: tasks.yaml\n")
    assert_fails_fast(load_team, team, "aliases expand", workspace / "tasks.yaml")


def test_deep_jsonl_tasks_file_is_refused(workspace):
    (workspace / "tasks.jsonl").write_text('{"text": "ok"}\n' + '{"a": ' * 3000 + "1" + "}" * 3000 + "\n")
    team = workspace / "team.yaml"
    team.write_text(team.read_text().split("tasks:")[0] + "tasks: tasks.jsonl\n")
    err = assert_fails_fast(load_team, team, "nested deeper than", workspace / "tasks.jsonl")
    assert err.line == 2


def test_task_yaml_bomb_is_a_task_file_error(tmp_path):
    folder = tmp_path / "036-roman-subtractive"
    shutil.copytree(ROOT / "tasks" / folder.name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "task.yaml").write_text((folder / "task.yaml").read_text() + bomb())
    err = assert_fails_fast(load_task, folder, "aliases expand", folder / "task.yaml")
    assert isinstance(err, TaskFileError)


@pytest.mark.parametrize("depth", [100, 100_000], ids=["over-the-cap", "past-the-recursion-limit"])
def test_replay_file_with_deep_json_is_a_config_error(tmp_path, depth):
    path = tmp_path / "replay.jsonl"
    path.write_text(json.dumps({"role": "a", "text": "x"}) + "\n" + "[" * depth + "]" * depth + "\n")
    err = assert_fails_fast(ReplayPolicy, path, "nested deeper than")
    assert (err.line, err.key) == (2, "(json)")


@pytest.mark.parametrize("line", ['{"text": "x"}', '{"role": "a", "text": 5}', '{"role": ["a"], "text": "x"}', '["a", "x"]'])
def test_a_replay_line_without_role_and_text_strings_is_refused_at_its_line(tmp_path, line):
    path = tmp_path / "replay.jsonl"
    path.write_text('{"role": "a", "text": "x"}\n' + line + "\n")
    with pytest.raises(ConfigError) as caught:
        ReplayPolicy(path)
    assert (caught.value.line, caught.value.key) == (2, "(line)") and 'needs "role" and "text" strings' in str(caught.value)


@pytest.mark.parametrize("index", ['"1"', "1.0", "true", "-1", "[1]"])
def test_a_replay_line_whose_episode_is_no_index_is_refused_at_its_line(tmp_path, index):
    """"1" was never played (a line waiting for an episode no run has), 1.0 and true were episode 1,
    a list was skipped: each said nothing until the run ran out of lines, or played the wrong one."""
    path = tmp_path / "replay.jsonl"
    path.write_text('{"role": "a", "text": "x", "episode": 0}\n{"role": "a", "text": "y", "episode": %s}\n' % index)
    with pytest.raises(ConfigError) as caught:
        ReplayPolicy(path)
    assert (caught.value.line, caught.value.key) == (2, "episode")
    assert "is no episode index (a whole number from 0)" in str(caught.value)


def test_jsonl_lines_split_on_newlines_only(tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_text(json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\r\n\n{}\n", encoding="utf-8")
    assert load_json_lines(path) == [(1, {"text": "a\u2028b"}), (3, {})]


def test_a_byte_order_mark_is_not_prompt_text(workspace):
    """A prompt saved with a BOM (as Windows editors do) began every rendered prompt with U+FEFF,
    where the YAML beside it reads the same with or without one."""
    bom = "\ufeff".encode()
    (workspace / "prompts" / "ctx.md.j2").write_bytes(bom + b"Context.\n")
    (workspace / "prompts" / "echo.md.j2").write_bytes(bom + b'Say {{ task.text }}.\n{% include "ctx.md.j2" %}')
    spec = load_role(workspace / "echo.yaml")
    prompt = spec.render(spec.context({"text": "hi"}, {}))[1]["content"]
    assert prompt == "Say hi.\nContext."


@pytest.mark.parametrize("bom", [b"", "\ufeff".encode()], ids=["plain", "bom"])
def test_a_byte_that_is_not_utf8_is_named_at_its_line(tmp_path, bom):
    """A Latin-1 "é" was named by its byte offset alone: its line, counted after a BOM as without one."""
    path = tmp_path / "latin.yaml"
    path.write_bytes(bom + b"x: 1\n\xe9t\xe9: 2\n")
    for load in (load_yaml, load_json_lines):
        with pytest.raises(ConfigError) as info:
            load(path)
        assert (info.value.line, info.value.key) == (2, "(file)") and "can't decode byte 0xe9" in info.value.problem


def test_json_and_jsonl_files_read_the_same_with_a_byte_order_mark(workspace):
    """json refused a BOM ("Unexpected UTF-8 BOM"): a schema file, a tasks.jsonl or a replay file
    saved in Notepad was a config error, where YAML read it."""
    bom = "\ufeff".encode()
    (workspace / "tasks.jsonl").write_bytes(bom + '{"text": "café"}\r\n'.encode())
    assert load_json_lines(workspace / "tasks.jsonl") == [(1, {"text": "café"})]
    team = workspace / "team.yaml"
    team.write_text(team.read_text().split("tasks:")[0] + "tasks: tasks.jsonl\n")
    assert load_team(team).tasks == [{"text": "café"}]
    role = workspace / "echo.yaml"
    text = role.read_text()
    start, end = text.index("output_schema:"), text.index("policy:")
    role.write_text(text[:start] + "output_schema: echo.json\n" + text[end:])
    (workspace / "echo.json").write_bytes(bom + b'{"type": "object", "properties": {"say": {"type": "string"}}}')
    assert load_role(role).schema["properties"] == {"say": {"type": "string"}}
