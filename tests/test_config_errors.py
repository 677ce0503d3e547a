"""Every malformed input gets one line ``FILE:LINE: KEY: problem`` on stderr and exit code 2."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from support import ERROR_LINE, ROOT, no_engine, write


def tasks_file(workspace: Path, name: str, text: str) -> None:
    """The team's inline tasks moved to the file ``name``, which holds ``text``."""
    replace_in(workspace / "team.yaml", 'tasks:\n  - {text: "the sea"}\n  - {text: "the sky"}', f"tasks: {name}")
    write(workspace / name, text)


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"fixture text {old!r} not in {path.name}"
    path.write_text(text.replace(old, new))


# (id, mutation, file the error must name, line or None, key, words the problem must contain)
CASES = [
    ("team-yaml-syntax", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]", "order: [echo, reviewer"),
     "team.yaml", None, "(yaml)", "invalid YAML"),
    ("role-yaml-syntax", lambda w: replace_in(w / "echo.yaml", "name: echo", "name: echo: again"),
     "echo.yaml", 1, "(yaml)", "invalid YAML"),
    ("team-unknown-key", lambda w: replace_in(w / "team.yaml", "tasks:", "episdoes: 3\ntasks:"),
     "team.yaml", 8, "episdoes", "unknown key"),
    ("role-unknown-key", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retry: 2"),
     "echo.yaml", 12, "max_retry", "unknown key"),
    ("role-unknown-nested-key", lambda w: replace_in(w / "echo.yaml", "temperature: 0.0", "temp: 0.0"),
     "echo.yaml", 11, "policy.sampling.temp", "unknown key"),
    ("team-wrong-type", lambda w: replace_in(w / "team.yaml", "tasks:", "episodes: many\ntasks:"),
     "team.yaml", 8, "episodes", "integer"),
    ("role-wrong-type", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: two"),
     "echo.yaml", 12, "max_retries", "integer"),
    # a key a merge key brings in is named at its line in the anchor: it was line 1
    ("role-merged-wrong-type", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "params: &defaults\n  max_retries: two\n<<: *defaults"),
     "echo.yaml", 13, "max_retries", "integer"),
    ("role-out-of-range", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: -1"),
     "echo.yaml", 12, "max_retries", "greater than or equal"),
    ("role-missing-key", lambda w: replace_in(w / "echo.yaml", "description: Repeats the task.\n", ""),
     "echo.yaml", 1, "description", "required key is missing"),
    ("role-penalty-not-finite", lambda w: replace_in(w / "echo.yaml", "invalid_penalty: -0.5", "invalid_penalty: -.inf"),
     "echo.yaml", 13, "invalid_penalty", "finite number"),
    ("role-penalty-positive", lambda w: replace_in(w / "echo.yaml", "invalid_penalty: -0.5", "invalid_penalty: 0.5"),
     "echo.yaml", 13, "invalid_penalty", "less than or equal to 0"),
    ("training-advantage-not-finite", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  invalid_advantage: .nan\ntasks:"),
     "team.yaml", 9, "training.invalid_advantage", "finite number"),
    # lax pydantic read `steps: yes` as 1 and `temperature: true` as 1.0
    ("training-steps-boolean", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  steps: yes\ntasks:"),
     "team.yaml", 9, "training.steps", "must be a number, not a boolean (got True)"),
    ("role-temperature-boolean", lambda w: replace_in(w / "echo.yaml", "temperature: 0.0", "temperature: true"),
     "echo.yaml", 11, "policy.sampling.temperature", "must be a number, not a boolean"),
    # named at the boolean's own key and line, not the dict's
    ("repetition-penalty-boolean", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  repetition_penalty:\n    reviewer: 0.5\n    echo: on\ntasks:"),
     "team.yaml", 11, "training.repetition_penalty.echo", "must be a number, not a boolean (got True)"),
    ("protocol-option-boolean", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]", "order: [echo, reviewer]\n  max_rounds: true"),
     "team.yaml", 5, "protocol.max_rounds", "must be a number, not a boolean"),
    ("plugin-option-boolean", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  reward: hybrid\n  reward_config: {alpha: false}\ntasks:"),
     "team.yaml", 10, "training.reward_config.alpha", "must be a number, not a boolean (got False)"),
    ("training-learning-rate-not-finite", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  adam: {learning_rate: 1e400}\ntasks:"),
     "team.yaml", 9, "training.adam.learning_rate", "finite number"),
    ("schema-bad-type", lambda w: replace_in(w / "echo.yaml", "  type: object", "  type: objekt"),
     "echo.yaml", 4, "output_schema", "invalid JSON Schema"),
    ("schema-bad-required", lambda w: replace_in(w / "echo.yaml", "required: [say]", "required: say"),
     "echo.yaml", 4, "output_schema", "invalid JSON Schema"),
    ("schema-not-object", lambda w: replace_in(w / "echo.yaml", "  type: object", "  type: string"),
     "echo.yaml", 4, "output_schema", "JSON object"),
    ("schema-ref-to-nowhere", lambda w: (replace_in(w / "echo.yaml", "say: {type: string}", "say: {$ref: '#/$defs/nope'}"),
                                         replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\ndecoding: free")),
     "echo.yaml", 4, "output_schema", "Pointer '/$defs/nope' does not exist"),
    # valid JSON Schema 2020-12, but no reply could match: every free-decoded turn was invalid
    ("schema-empty-enum", lambda w: (replace_in(w / "echo.yaml", "say: {type: string}", "say: {enum: []}"),
                                     replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\ndecoding: free")),
     "echo.yaml", 4, "output_schema", "invalid JSON Schema at properties/say/enum: an empty enum allows no value"),
    ("schema-yaml-date", lambda w: replace_in(w / "echo.yaml", "say: {type: string}", "say: {enum: [2024-01-01]}"),
     "echo.yaml", 7, "output_schema.properties.say.enum[0]", "a date is not JSON data"),
    ("schema-file-missing", lambda w: _schema_file(w, None),
     "echo.yaml", 4, "output_schema", "schema file not found"),
    # there, but no file to read: not "not found"
    ("schema-file-a-folder", lambda w: (_schema_file(w, None), (w / "schemas" / "echo.json").mkdir(parents=True)),
     "echo.yaml", 4, "output_schema", "cannot read schema file"),
    ("schema-file-broken", lambda w: _schema_file(w, "{not json"),
     "echo.yaml", 4, "output_schema", "cannot read schema file"),
    # json keeps the last of a key given twice: the schema ran as an array's
    ("schema-file-duplicate-key", lambda w: _schema_file(w, '{"type": "object", "properties": {"say": {}}, "type": "array"}'),
     "echo.yaml", 4, "output_schema", "echo.json: duplicate key 'type'"),
    ("template-missing", lambda w: (w / "prompts" / "echo.md.j2").unlink(),
     "echo.yaml", 3, "prompt", "not found"),
    ("template-syntax", lambda w: write(w / "prompts" / "echo.md.j2", "line one\n{% if task %}\nno end\n"),
     "echo.md.j2", None, "prompt", "template syntax error"),
    ("template-undefined-variable", lambda w: write(w / "prompts" / "echo.md.j2", "Hi\n{{ topik }}\n"),
     "echo.md.j2", 2, "prompt", "topik"),
    # each undefined variable is named where it is read: line, file and key
    ("template-undefined-variable-line", lambda w: write(w / "prompts" / "echo.md.j2", "Task:\n{{ task.text }}\nThe {{ t }}\n"),
     "echo.md.j2", 3, "prompt", "variable(s) t;"),
    ("followup-undefined-variable", lambda w: (replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\nfollowup: prompts/more.md.j2"),
                                               write(w / "prompts" / "more.md.j2", "Again:\n{{ lastt }}\n")),
     "more.md.j2", 2, "followup", "lastt"),
    ("followup-syntax", lambda w: (replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\nfollowup: prompts/more.md.j2"),
                                   write(w / "prompts" / "more.md.j2", "Again:\n{% if last %}\n")),
     "more.md.j2", None, "followup", "template syntax error"),
    ("system-undefined-variable", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\nsystem: 'You are {{ rolee }}.'"),
     "echo.yaml", 13, "system", "rolee"),
    ("team-system-undefined-variable", lambda w: replace_in(w / "team.yaml", "  - use: reviewer", "  - use: reviewer\n    system: 'Be {{ mood }}.'"),
     "team.yaml", 8, "roles[1].system", "mood"),
    ("included-template-undefined-variable", lambda w: (write(w / "prompts" / "echo.md.j2", '{% include "ctx.md.j2" %}\n{{ task.text }}\n'),
                                                        write(w / "prompts" / "ctx.md.j2", "Context:\n{{ contxt }}\n")),
     "ctx.md.j2", 2, "prompt", "contxt"),
    ("template-unknown-filter", lambda w: write(w / "prompts" / "echo.md.j2", "Hi\n{% for m in history %}{{ m | tojosn }}{% endfor %}\n"),
     "echo.md.j2", 2, "prompt", "No filter named 'tojosn'"),
    ("template-unknown-filter-in-if", lambda w: write(w / "prompts" / "echo.md.j2", "Hi\n{% if history %}{{ history | tojosn }}{% endif %}\n"),
     "echo.md.j2", 2, "prompt", "No filter named 'tojosn'"),
    ("template-unknown-test-in-if", lambda w: write(w / "prompts" / "echo.md.j2", "Hi\n{% if last is nonee %}first{% endif %}\n"),
     "echo.md.j2", 2, "prompt", "No test named 'nonee'"),
    ("included-template-unknown-filter", lambda w: (write(w / "prompts" / "echo.md.j2", '{% include "ctx.md.j2" %}\n'),
                                                    write(w / "prompts" / "ctx.md.j2", "Hi\n{{ task | tojosn }}\n")),
     "ctx.md.j2", 2, "prompt", "No filter named 'tojosn'"),
    # a template it includes that is not UTF-8: a traceback from `system`, the includer named as unreadable from `prompt`
    ("system-included-template-not-utf8", lambda w: (replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\nsystem: '{% include \"ctx.md.j2\" %}'"),
                                                     (w / "prompts" / "ctx.md.j2").write_bytes(b"caf\xe9\n")),
     "echo.yaml", 13, "system", "cannot read the template it includes: 'utf-8' codec can't decode byte 0xe9"),
    ("included-template-not-utf8", lambda w: (write(w / "prompts" / "echo.md.j2", 'Hi\n{% include "ctx.md.j2" %}\n'),
                                              (w / "prompts" / "ctx.md.j2").write_bytes(b"caf\xe9\n")),
     "echo.md.j2", 2, "prompt", "cannot read the template it includes: 'utf-8' codec can't decode byte 0xe9"),
    ("included-template-missing", lambda w: write(w / "prompts" / "echo.md.j2", '{% include "ctx.md.j2" %}\n'),
     "echo.md.j2", None, "prompt", "included template not found: ctx.md.j2"),
    # an import sees no context by default: validate passed, then every render failed ('task' is undefined)
    ("imported-template-reads-context", lambda w: (write(w / "prompts" / "echo.md.j2", 'Hi\n{% import "m.md.j2" as m %}{{ m.show() }}\n'),
                                                   write(w / "prompts" / "m.md.j2", "{% macro show() %}{{ task.text }}{% endmacro %}\n")),
     "echo.md.j2", 2, "prompt", "'m.md.j2', imported without context, cannot read task: add `with context` to the import"),
    ("unknown-role", lambda w: replace_in(w / "team.yaml", "use: reviewer", "use: chef"),
     "team.yaml", 7, "roles[1].use", "unknown role 'chef'"),
    ("routes-to-unknown-role", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]", "order: [echo, critic]"),
     "team.yaml", 4, "protocol.order[1]", "unknown role 'critic'"),
    ("unknown-plugin", lambda w: replace_in(w / "team.yaml", "type: pipeline", "type: chess_tournament"),
     "team.yaml", 3, "protocol.type", "unknown env plugin 'chess_tournament'"),
    ("duplicate-role", lambda w: replace_in(w / "team.yaml", "  - use: reviewer", "  - use: reviewer\n  - use: reviewer"),
     "team.yaml", 8, "roles[2].use", "duplicate role name 'reviewer'"),
    ("duplicate-renamed-role", lambda w: replace_in(w / "team.yaml", "  - use: reviewer", "  - use: reviewer\n  - use: planner\n    name: echo"),
     "team.yaml", 9, "roles[2].name", "duplicate role name 'echo'"),
    ("duplicate-yaml-key", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\nmax_retries: 3"),
     "echo.yaml", 13, "max_retries", "duplicate key"),
    # YAML 1.1 reads on/off/yes/no as booleans: named at line 1 as "[1]: Keys should be strings"
    ("key-yaml-reads-as-bool", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\non: 3"),
     "echo.yaml", 13, "on", 'YAML reads this key as true or false: quote it ("on")'),
    # a task's number key was kept as a number here and as text in its transcript line
    ("task-key-yaml-reads-as-number", lambda w: replace_in(w / "team.yaml", '{text: "the sea"}', '{text: "the sea", 1: x}'),
     "team.yaml", 9, "tasks[0].1", 'YAML reads this key as a number: quote it ("1")'),
    ("protocol-unknown-key", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]", "order: [echo, reviewer]\n  rounds: 3"),
     "team.yaml", 5, "protocol.rounds", "unknown key"),
    ("override-wrong-type", lambda w: replace_in(w / "team.yaml", "  - use: reviewer", "  - use: reviewer\n    max_retries: lots"),
     "team.yaml", 8, "roles[1].max_retries", "integer"),
    # it names the adapter's folders: validated, then training failed at its first write (File name too long)
    ("adapter-name-too-long", lambda w: replace_in(w / "team.yaml", "use: ./echo.yaml", "use: ./echo.yaml\n    policy: {adapter: " + "a" * 300 + "}"),
     "team.yaml", 7, "roles[0].policy.adapter", "at most 128 characters"),
    # a "\0" in a quoted path: a ValueError (embedded null byte) traceback as the path resolved
    ("prompt-path-nul", lambda w: replace_in(w / "echo.yaml", "prompt: prompts/echo.md.j2", 'prompt: "prompts/echo\\0.md.j2"'),
     "echo.yaml", 3, "prompt", "'prompts/echo\\x00.md.j2' holds a NUL character, which no file name can"),
    ("tasks-path-nul", lambda w: replace_in(w / "team.yaml", 'tasks:\n  - {text: "the sea"}\n  - {text: "the sky"}', 'tasks: "t\\0.jsonl"'),
     "team.yaml", 8, "tasks", "holds a NUL character"),
    ("use-path-nul", lambda w: replace_in(w / "team.yaml", "use: ./echo.yaml", 'use: "./echo\\0.yaml"'),
     "team.yaml", 6, "roles[0].use", "'./echo\\x00.yaml' holds a NUL character"),
    ("bad-binding", lambda w: replace_in(w / "echo.yaml", "adapter: null", "adapter: null\n  bind: telepathy:now"),
     "echo.yaml", 11, "policy.bind", "unknown policy kind"),
    ("bind-replay-without-a-file", lambda w: replace_in(w / "echo.yaml", "adapter: null", "adapter: null\n  bind: 'replay:'"),
     "echo.yaml", 11, "policy.bind", "needs a target after 'replay:'"),
    ("bind-replay-a-folder", lambda w: replace_in(w / "echo.yaml", "adapter: null", "adapter: null\n  bind: replay:prompts"),
     "echo.yaml", 11, "policy.bind", "replay file not found"),
    ("bind-unknown-builtin", lambda w: replace_in(w / "echo.yaml", "adapter: null", "adapter: null\n  bind: builtin:oracle"),
     "echo.yaml", 11, "policy.bind", "unknown builtin policy 'oracle'"),
    ("bind-python-no-function", lambda w: replace_in(w / "echo.yaml", "adapter: null", "adapter: null\n  bind: python:os"),
     "echo.yaml", 11, "policy.bind", "must look like pkg.module:function"),
    ("bind-python-not-callable", lambda w: replace_in(w / "echo.yaml", "adapter: null", "adapter: null\n  bind: python:os:sep"),
     "echo.yaml", 11, "policy.bind", "'os' has no callable 'sep'"),
    # bound the team's model, the name after it ignored: the model is --model's to choose
    ("model-binding-with-a-name", lambda w: replace_in(w / "echo.yaml", "adapter: null", "adapter: null\n  bind: model:Qwen/Qwen2.5-7B"),
     "echo.yaml", 11, "policy.bind", "'model' takes nothing after it"),
    # the team sets policy.adapter; the role file's other policy keys are still its own
    ("override-beside-role-key", lambda w: (replace_in(w / "echo.yaml", "temperature: 0.0", "temp: 0.0"),
                                            replace_in(w / "team.yaml", "use: ./echo.yaml", "use: ./echo.yaml\n    policy: {adapter: echo}")),
     "echo.yaml", 11, "policy.sampling.temp", "unknown key"),
    ("team-protocol-misspelt", lambda w: replace_in(w / "team.yaml", "protocol:", "protocl:"),
     "team.yaml", 1, "protocol", "required key is missing"),
    ("empty-file", lambda w: write(w / "team.yaml", "\n"), "team.yaml", 1, "(file)", "empty"),
    # was "team.yaml:1: description: required key is missing", as if it were a role lacking one
    ("role-use-names-a-team", lambda w: replace_in(w / "team.yaml", "use: ./echo.yaml", "use: ./team.yaml"),
     "team.yaml", 6, "roles[0].use", "team.yaml is a team file (protocol, roles, tasks), not a role file"),
    ("role-not-mapping", lambda w: write(w / "echo.yaml", "- name: echo\n"), "echo.yaml", 1, "(root)", "mapping"),
    # validated, then the run failed writing the task into transcripts.jsonl (TypeError traceback)
    ("task-yaml-date", lambda w: replace_in(w / "team.yaml", '{text: "the sea"}', '{text: "the sea", due: 2024-01-01}'),
     "team.yaml", 9, "tasks[0].due", "a date is not JSON data: quote it to keep it as text"),
    # a date or number YAML's resolver takes but cannot make: a ValueError traceback
    ("task-yaml-impossible-date", lambda w: replace_in(w / "team.yaml", '{text: "the sea"}', '{text: "the sea", due: 2024-02-30}'),
     "team.yaml", 9, "(yaml)", "'2024-02-30' is not a date: quote it to keep it as text"),
    ("role-yaml-impossible-number", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 0x_"),
     "echo.yaml", 12, "(yaml)", "'0x_' is not a number"),
    # the reader refuses it before parsing, outside the handler meant for it: a ReaderError traceback
    ("role-yaml-control-character", lambda w: replace_in(w / "echo.yaml", "Repeats the task.", "Repeats\x01 the task."),
     "echo.yaml", 2, "(yaml)", "invalid YAML: unacceptable character #x0001: special characters are not allowed"),
    # a tasks file holding no task: every draw of a task failed mid-run
    ("tasks-file-empty-list", lambda w: tasks_file(w, "tasks.yaml", "[]\n"),
     "team.yaml", 8, "tasks", "must hold a non-empty list of mappings"),
    # a recipe in which no role learns: nothing would train
    ("training-without-a-learner", lambda w: replace_in(w / "team.yaml", "  - use: reviewer\ntasks:",
                                                        "  - use: reviewer\n    policy: {trainable: false}\ntraining: {steps: 3}\ntasks:"),
     "team.yaml", 9, "training", "no role learns"),
    ("tasks-file-missing", lambda w: replace_in(w / "team.yaml", 'tasks:\n  - {text: "the sea"}\n  - {text: "the sky"}', "tasks: tasks.jsonl"),
     "team.yaml", 8, "tasks", "cannot read tasks file"),
    # a tasks file that is not UTF-8: was "cannot read tasks file" at the team's `tasks` key, not at its line
    ("tasks-file-not-utf8", lambda w: (tasks_file(w, "tasks.jsonl", '{"text": "the sea"}\n'),
                                       (w / "tasks.jsonl").write_bytes(b'{"text": "the sea"}\n{"text": "caf\xe9"}\n')),
     "tasks.jsonl", 2, "(file)", "cannot read: 'utf-8' codec can't decode byte 0xe9"),
    # an entry of a tasks file that is no mapping: was named at the team's `tasks` key, not its own line
    ("tasks-yaml-entry-not-mapping", lambda w: tasks_file(w, "tasks.yaml", "- {text: the sea}\n- the sky\n"),
     "tasks.yaml", 2, "[1]", "a task must be a mapping, not str"),
    # was the last of the two texts, without a word
    ("tasks-jsonl-duplicate-key", lambda w: tasks_file(w, "tasks.jsonl", '{"text": "the sea"}\n{"text": "the sky", "text": "the sun"}\n'),
     "tasks.jsonl", 2, "(json)", "not valid JSON: duplicate key 'text'"),
    # a lone surrogate escape loaded, then writing the run's config.yaml raised UnicodeEncodeError
    ("team-yaml-lone-surrogate", lambda w: replace_in(w / "team.yaml", '{text: "the sky"}', '{text: "the \\udcff sky"}'),
     "team.yaml", 10, "tasks[1].text", "a lone surrogate escape (\\ud800-\\udfff without its pair)"),
    ("tasks-jsonl-lone-surrogate", lambda w: tasks_file(w, "tasks.jsonl", '{"text": "the sea"}\n{"text": "the \\udcff sky"}\n'),
     "tasks.jsonl", 2, "(json)", "a lone surrogate escape (\\ud800-\\udfff without its pair)"),
    ("tasks-jsonl-entry-not-mapping", lambda w: tasks_file(w, "tasks.jsonl", '{"text": "the sea"}\n\n["the sky"]\n'),
     "tasks.jsonl", 3, "(task)", "a task must be a mapping, not list"),
    # the suffix in upper case: read as YAML, whose error ("expected <document start>") hid the line's
    ("tasks-JSONL-upper-case", lambda w: tasks_file(w, "tasks.JSONL", '{"text": "the sea"}\n\n["the sky"]\n'),
     "tasks.JSONL", 3, "(task)", "a task must be a mapping, not list"),
    ("loop-back-forward", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]",
                                               "order: [echo, reviewer]\n  loop_back: {from: echo, to: reviewer, field: verdict, values: [x]}"),
     "team.yaml", 2, "protocol", "must come before"),
    # a role of the team that never acts in order: the loop would jump to nowhere mid-episode
    ("loop-back-outside-order", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]",
                                                     "order: [reviewer]\n  loop_back: {from: reviewer, to: echo, field: verdict, values: [x]}"),
     "team.yaml", 2, "protocol", "loop_back.to ('echo') is not in order"),
    # the loop jumped to the role's first position and fired at either: rounds went astray
    ("loop-back-role-twice-in-order", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]",
                                                           "order: [echo, reviewer, echo]\n  loop_back: {from: reviewer, to: echo, field: verdict, values: [x]}"),
     "team.yaml", 2, "protocol", "loop_back.to ('echo') appears 2 times in order"),
    # its verdict would never come: every episode would pay failure_reward
    ("success-outside-order", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]",
                                                   "order: [reviewer]\n  success: {role: echo, field: say, values: [x]}"),
     "team.yaml", 2, "protocol", "success.role ('echo') is not in order"),
    # a field the role's schema does not declare: the loop never fired, success never came
    ("loop-back-field-not-in-schema", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]",
                                                           "order: [echo, reviewer]\n  loop_back: {from: reviewer, to: echo, field: verdcit, values: [x]}"),
     "team.yaml", 2, "protocol", "PipelineEnv reads field(s) verdcit of the messages of role 'reviewer'"),
    # a value the field's enum never allows (`redo` for request_changes): the loop never fired
    ("loop-back-value-not-in-enum", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]",
                                                         "order: [echo, reviewer]\n  loop_back: {from: reviewer, to: echo, field: verdict, values: [redo]}"),
     "team.yaml", 2, "protocol", "PipelineEnv waits for verdict 'redo' from role 'reviewer', which its output_schema's enum "
                                 "never allows ('approve', 'request_changes')"),
    # 40 rounds of a two-role loop take 80 turns: every episode that looped on stopped at max_turns 64
    ("loop-back-rounds-past-max-turns", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]",
                                                             "order: [echo, reviewer]\n  max_rounds: 40\n"
                                                             "  loop_back: {from: reviewer, to: echo, field: verdict, values: [approve]}"),
     "team.yaml", 2, "protocol", "a whole game can take 80 turns and max_turns is 64"),
    # an own role written for another protocol: every episode failed with KeyError: 'example'
    ("code-pair-field-not-in-schema", lambda w: replace_in(w / "team.yaml", "type: pipeline\n  order: [echo, reviewer]",
                                                           "type: code_pair\n  tester: echo\n  coder: reviewer"),
     "team.yaml", 2, "protocol", "CodePairEnv reads field(s) example of the messages of role 'echo', which its output_schema "
                                 "does not declare (properties: say)"),
    # a judge of one's own whose verdict is not `winner`: every debate was a silent tie
    ("debate-judge-field-not-in-schema", lambda w: (replace_in(w / "team.yaml", "  - use: reviewer", "  - use: reviewer\n  - use: debater"),
                                                    replace_in(w / "team.yaml", "type: pipeline\n  order: [echo, reviewer]",
                                                               "type: debate\n  debaters: [reviewer, debater]\n  judge: echo")),
     "team.yaml", 2, "protocol", "DebateEnv reads field(s) winner of the messages of role 'echo'"),
    ("loop-back-unknown-key", lambda w: replace_in(w / "team.yaml", "order: [echo, reviewer]",
                                                   "order: [echo, reviewer]\n  loop_back: {from: reviewer, to: echo, field: verdict, values: [x], frm: 1}"),
     "team.yaml", 5, "protocol.loop_back.frm", "unknown key (allowed: field, from, to, values)"),
    ("decoding-unknown", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\ndecoding: strict"),
     "echo.yaml", 13, "decoding", "constrained"),
    ("reply-prefix-outside-schema", lambda w: replace_in(w / "echo.yaml", "max_retries: 2", "max_retries: 2\nreply_prefix: '{\"shout\": '"),
     "echo.yaml", 13, "reply_prefix", "does not start a message the schema allows"),
    # free decoding: the prefix opens every reply, so a misspelt key made every turn invalid
    ("reply-prefix-outside-schema-free", lambda w: replace_in(w / "echo.yaml", "max_retries: 2",
                                                              "max_retries: 2\ndecoding: free\nreply_prefix: 'Here: {\"shout\": '"),
     "echo.yaml", 14, "reply_prefix", "reply_prefix 'Here: {\"shout\": ' does not start a message the schema allows, so no reply could be valid"),
    ("reply-prefix-loose-json", lambda w: replace_in(w / "team.yaml", "  - use: reviewer", "  - use: reviewer\n    reply_prefix: '{ \"verdict\":'"),
     "team.yaml", 8, "roles[1].reply_prefix", "decoding: free"),
    ("unknown-trainer", lambda w: replace_in(w / "team.yaml", "tasks:", "training: {trainer: alphazero}\ntasks:"),
     "team.yaml", 8, "training.trainer", "unknown trainer plugin 'alphazero'"),
    ("unknown-reward", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  reward: vibes\ntasks:"),
     "team.yaml", 9, "training.reward", "unknown reward plugin 'vibes'"),
    ("training-wrong-type", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  steps: -3\ntasks:"),
     "team.yaml", 9, "training.steps", "greater than or equal to 1"),
    ("lora-on-the-head", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  lora: {target_modules: [q_proj, lm_head]}\ntasks:"),
     "team.yaml", 9, "training.lora.target_modules", "lm_head: not a module a LoRA here can target"),
    ("training-unknown-key", lambda w: replace_in(w / "team.yaml", "tasks:", "training:\n  stpes: 3\ntasks:"),
     "team.yaml", 9, "training.stpes", "unknown key (allowed: adam, checkpoint_every,"),
    # a union field: the key is the file's (tasks[0]), not pydantic's member name (tasks.list[dict[str,any]][0])
    ("task-not-a-mapping", lambda w: replace_in(w / "team.yaml", '  - {text: "the sea"}', "  - 3"),
     "team.yaml", 9, "tasks[0]", "valid dictionary"),
    ("schema-not-a-mapping", lambda w: replace_in(w / "team.yaml", "  - use: reviewer", "  - use: reviewer\n    output_schema: false"),
     "team.yaml", 8, "roles[1].output_schema", "valid"),
]


def _schema_file(w: Path, content: str | None) -> None:
    text = (w / "echo.yaml").read_text()
    start = text.index("output_schema:")
    end = text.index("policy:")
    (w / "echo.yaml").write_text(text[:start] + "output_schema: schemas/echo.json\n" + text[end:])
    if content is not None:
        write(w / "schemas" / "echo.json", content)


def test_fixture_team_is_valid(workspace, cli):
    code, out, err = cli("validate", workspace / "team.yaml", workspace / "echo.yaml", ROOT / "recipes/guess_number.yaml")
    assert code == 0, err
    assert "(team echoes: 2 roles, protocol pipeline)" in out and "(role echo)" in out and err == ""
    assert "(team guess_number: 1 role, protocol guess_number)" in out  # was "1 roles"


def test_validate_compiles_a_role_files_grammar_as_a_teams(workspace, cli):
    """A role file alone is checked as binding it to the model checks it: a reply_prefix its schema
    cannot start is its line, exit 2, as in its team."""
    replace_in(workspace / "echo.yaml", "max_retries: 2", "max_retries: 2\nreply_prefix: '{\"shout\": '")
    code, out, err = cli("validate", workspace / "echo.yaml")
    assert (code, out) == (2, "") and err.startswith(f"{workspace / 'echo.yaml'}:13: reply_prefix: "), err


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_input_is_one_line_exit_2(case, workspace, cli):
    _, mutate, file, line, key, words = case
    mutate(workspace)
    code, out, err = cli("validate", workspace / "team.yaml")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    m = ERROR_LINE.match(lines[0])
    assert m, lines[0]
    assert Path(m["file"]).name == file
    if line is not None:
        assert m["line"] is not None and int(m["line"]) == line, lines[0]
    assert m["key"] == key, lines[0]
    assert words in m["problem"], lines[0]
    assert "Traceback" not in err


def test_missing_file(tmp_path, cli):
    code, _, err = cli("validate", tmp_path / "nope.yaml")
    assert code == 2
    assert err.strip() == f"{tmp_path / 'nope.yaml'}: (file): file not found"


def test_a_folder_without_yaml_files_is_refused_not_ok(tmp_path, cli):
    (tmp_path / "notes.txt").write_text("no roles here")
    code, out, err = cli("validate", tmp_path)  # it had checked nothing, and exit 0 said all was well
    assert (code, out, err.strip()) == (2, "", f"rolecast: no YAML files found in {tmp_path}")
    (tmp_path / "index.yaml.html").write_text("<html>")  # *.y*ml matches it: not a YAML file for all that
    code, out, err = cli("validate", tmp_path)
    assert (code, out, err.strip()) == (2, "", f"rolecast: no YAML files found in {tmp_path}")


def test_validate_walks_past_packages_and_runs(workspace, cli):
    """`rolecast validate .` in a project: the YAML of its .venv, of a virtualenv by another name and
    of its run dirs is not the user's, and each had been a failure."""
    write(workspace / ".venv/lib/site-packages/pkg/data.yaml", "a: 1\n")
    write(workspace / "env/pyvenv.cfg", "home = /usr/bin\n")
    write(workspace / "env/lib/broken.yml", "b: [\n")
    write(workspace / "runs/first/config.yaml", "team: {name: echoes}\nrun: {episodes: 2}\n")
    write(workspace / "runs/trained/config.yaml", "recipe: {name: echoes}\nrun: {steps: 2}\n")
    write(workspace / "runs/trained/rollouts/step-000001/summary.yaml", "c: 1\n")
    (workspace / "ECHO.YML").write_text((workspace / "echo.yaml").read_text())  # a suffix in upper case is YAML too
    code, out, err = cli("validate", workspace)
    assert (code, err) == (0, ""), err
    assert {line.split()[1] for line in out.splitlines()} == {str(workspace / f) for f in ("team.yaml", "echo.yaml", "ECHO.YML")}
    write(workspace / "runs/config.yaml", "run: {episodes: 2}\n")  # not a run's record: checked, and refused
    code, _, err = cli("validate", workspace)
    assert code == 2 and err.startswith(f"{workspace / 'runs/config.yaml'}:1:"), err


def test_validate_passes_over_a_tasks_file_in_a_folder(workspace, cli):
    """A team's tasks in a YAML file (a list, which no role or team is): `rolecast validate .` had
    failed on it as a role file ("a role file must be a mapping of keys"); the team checks it."""
    tasks_file(workspace, "tasks.yaml", "- {text: the sea}\n- {text: the sky}\n")
    code, out, err = cli("validate", workspace)
    assert (code, err) == (0, ""), err
    assert f"{workspace / 'tasks.yaml'}  (tasks, checked with the team that names them)" in out
    assert f"ok  {workspace / 'team.yaml'}" in out
    write(workspace / "tasks.yaml", "- {text: the sea}\n- the sky\n")  # still checked, through the team
    code, _, err = cli("validate", workspace)
    assert code == 2 and err.startswith(f"{workspace / 'tasks.yaml'}:2:"), err


def test_validate_says_each_mistake_as_a_json_line_with_log_json(tmp_path, cli):
    """``rolecast --log-json validate``: its FILE: KEY: problem lines were console text among the JSON lines."""
    code, out, err = cli("--log-json", "validate", tmp_path / "nope.yaml", tmp_path / "gone.yaml")
    lines = [json.loads(line) for line in err.splitlines()]
    assert code == 2 and out == "" and [line["level"] for line in lines] == ["error", "error"]
    assert lines[1]["event"] == f"{tmp_path / 'gone.yaml'}: (file): file not found"


def test_team_override_keeps_role_file_paths(workspace, cli):
    """A replay file the role names resolves from the role's folder, whatever policy keys the team sets."""
    write(workspace / "sub" / "echo.yaml", (workspace / "echo.yaml").read_text()
          .replace("prompts/", "../prompts/").replace("adapter: null", "adapter: null\n  bind: replay:echo.jsonl"))
    write(workspace / "sub" / "echo.jsonl", '{"role": "echo", "text": "{\\"say\\": \\"hi\\"}"}\n')
    replace_in(workspace / "team.yaml", "use: ./echo.yaml", "use: ./sub/echo.yaml\n    policy: {adapter: echo}")
    code, _, err = cli("validate", workspace / "team.yaml")
    assert code == 0, err


def test_included_template_sees_the_includers_variables(workspace, cli):
    write(workspace / "prompts" / "echo.md.j2", '{% for line in task.text.split() %}{% include ["no.md.j2", "line.md.j2"] %}{% endfor %}\n'
                                                '{% include "optional.md.j2" ignore missing %}\n')
    write(workspace / "prompts" / "line.md.j2", "- {{ line }}\n")
    code, _, err = cli("validate", workspace / "team.yaml")
    assert code == 0, err


def test_run_reports_config_error_without_traceback(workspace, cli):
    replace_in(workspace / "team.yaml", "use: reviewer", "use: chef")
    code, _, err = cli("run", workspace / "team.yaml", "--policy", "echo=builtin:stub")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "chef" in err


def test_debug_shows_traceback(workspace):
    from orchestrator.cli import main
    from orchestrator.errors import ConfigError

    replace_in(workspace / "team.yaml", "use: reviewer", "use: chef")
    with pytest.raises(ConfigError):
        main(["--debug", "validate", str(workspace / "team.yaml")])


def test_a_commands_bad_file_is_the_line_validate_says(workspace, cli):
    """FILE:LINE: KEY: problem, as README's Bad input shows it: not prefixed "rolecast: " as other errors are."""
    replace_in(workspace / "team.yaml", "use: reviewer", "use: chef")
    _, _, said = cli("validate", workspace / "team.yaml")
    code, _, err = cli("run", workspace / "team.yaml", "--out", workspace / "run")
    assert code == 2 and err == said and ERROR_LINE.match(err.strip())


def test_rolecast_without_a_command_prints_its_help_and_exits_2(cli):
    """Nothing was done: exit 2, as argparse's own usage errors, not 0 as if a command had run."""
    code, out, _ = cli()
    assert code == 2 and "commands:" in out and "validate" in out


def test_a_command_whose_run_failed_exits_1_not_the_usage_code(cli, monkeypatch):
    """2 says the command was given wrong: a run that started and failed (RunFailed) is 1."""
    from orchestrator.errors import RunFailed

    def failed(args):
        raise RunFailed("every episode failed")

    monkeypatch.setattr("orchestrator.cli.validate.handle", failed)
    assert cli("validate", "team.yaml")[::2] == (1, "rolecast: every episode failed\n")


def test_debug_shows_a_disk_faults_traceback_too(cli, monkeypatch):
    """A full disk is one line naming the file, exit 1; with --debug, the traceback, as for any error."""
    import errno

    from orchestrator import logs
    from orchestrator.cli import main

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "runs/x/metrics.jsonl")

    monkeypatch.setattr("orchestrator.cli.validate.handle", full)
    code, _, err = cli("validate", "team.yaml")
    assert (code, err.strip()) == (1, "rolecast: runs/x/metrics.jsonl: No space left on device")
    try:
        with pytest.raises(OSError, match="No space left"):
            main(["--debug", "validate", "team.yaml"])
    finally:
        logs.configure()


def test_debug_shows_debug_logs(cli, monkeypatch):
    import structlog

    from orchestrator import logs

    def chatty(args):
        structlog.get_logger().debug("a debug line")
        return 0

    monkeypatch.setattr("orchestrator.cli.validate.handle", chatty)
    try:
        assert cli("validate", "team.yaml")[2] == ""
        code, _, err = cli("--debug", "validate", "team.yaml")
        assert code == 0 and "a debug line" in err
    finally:
        logs.configure()


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])  # PYTHONIOENCODING=ascii; LC_ALL=C
def test_what_stdout_cannot_encode_is_escaped_not_a_traceback(errors, workspace, monkeypatch):
    """Where stdout is ASCII (or Latin-1) `validate`'s ok line for a file in é, like `run`'s ±
    column, was a UnicodeEncodeError traceback."""
    from orchestrator.cli import main

    (workspace / "echo.yaml").rename(workspace / "écho.yaml")
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors=errors))
    assert main(["validate", str(workspace / "écho.yaml")]) == 0
    sys.stdout.seek(0)
    assert sys.stdout.read() == f"ok  {str(workspace).encode('ascii', 'backslashreplace').decode()}/\\xe9cho.yaml  (role echo)\n"


@pytest.mark.parametrize("edit, where", [
    (lambda w: ((w / "echo.yaml").rename(w / "écho.yaml"), replace_in(w / "team.yaml", "./echo.yaml", "./écho.yaml")),
     "team.yaml:6: roles[0].use: './\\xe9cho.yaml' cannot"),
    (lambda w: ((w / "prompts/echo.md.j2").rename(w / "prompts/écho.md.j2"), replace_in(w / "echo.yaml", "echo.md.j2", "écho.md.j2")),
     "echo.yaml:3: prompt: 'prompts/\\xe9cho.md.j2' cannot")])
def test_a_file_name_the_locale_cannot_encode_is_one_line_saying_so(edit, where, workspace):
    """Under LC_ALL=C with PYTHONUTF8=0 the file system encoding is ASCII: a role file in é was
    "unknown role: ... nor an existing file" (it existed), a prompt in é a UnicodeEncodeError
    traceback. Both say what is wrong, and what to run with instead."""
    import os
    import subprocess

    edit(workspace)
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "validate", "team.yaml"], cwd=workspace, env=env,
                          capture_output=True, text=True, errors="backslashreplace")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert where in proc.stderr and "the file system encoding is ascii; run with PYTHONUTF8=1" in proc.stderr, proc.stderr


@pytest.mark.parametrize("bind", ["replay:lines.jsonl", "python:os.path:join", "python:os.path.join"])
def test_a_role_files_binding_reads_a_replay_beside_it_and_a_function_by_either_path(bind, workspace, cli):
    write(workspace / "lines.jsonl", '{"role": "echo", "text": "{}"}\n')  # beside echo.yaml, not in the cwd
    replace_in(workspace / "echo.yaml", "adapter: null", f"adapter: null\n  bind: {bind}")
    code, _, err = cli("validate", workspace / "team.yaml")
    assert code == 0, err


def test_bad_policy_flag(workspace, cli):
    code, _, err = cli("run", workspace / "team.yaml", "--policy", "echo=python:no_such_module_xyz:fn")
    assert code == 2 and "cannot import 'no_such_module_xyz'" in err


def test_bool_options_stay_bool_and_1e_4_reads_as_a_number(workspace, cli):
    """Refusing booleans for numbers keeps bool fields, and a YAML '1e-4' (a string) still reads as a float."""
    replace_in(workspace / "team.yaml", "tasks:", "training:\n  joint_passes: true\n  adam: {learning_rate: 1e-4}\n"
                                                  "  trainer_config: {scale_std: false}\ntasks:")
    replace_in(workspace / "echo.yaml", "adapter: null", "adapter: null\n  trainable: no")
    code, _, err = cli("validate", workspace / "team.yaml")
    assert code == 0, err


def test_e_notation_is_a_number_as_in_yaml_1_2_and_what_only_looks_like_it_stays_text(tmp_path):
    """PyYAML's YAML 1.1 wants a dot and a signed exponent in a float: 1e5, 2.5E3 and 1e-4 would be text."""
    from orchestrator.yamlfile import load_yaml, read_value

    doc = load_yaml(write(tmp_path / "n.yaml", "a: 1e-4\nb: 1e5\nc: 2.5E3\nd: -3e+2\ne: 1e\nf: e5\ng: 1.5\n"))
    assert doc.data == {"a": 1e-4, "b": 1e5, "c": 2500.0, "d": -300.0, "e": "1e", "f": "e5", "g": 1.5}
    assert read_value("1e5") == 1e5


def test_loading_a_team_compiles_no_grammar(workspace, monkeypatch):
    """xgrammar imports torch and transformers (seconds), which a run with no model never needs:
    what it checks (a reply prefix the schema allows) waits for validate or a model binding."""
    import orchestrator.grammar.schema
    from orchestrator.errors import ConfigError
    from orchestrator.policies.binding import parse_binding
    from orchestrator.rollout import build_policies
    from orchestrator.team import load_team

    monkeypatch.setattr(orchestrator.grammar.schema, "xgrammar", lambda: pytest.fail("xgrammar imported"))
    for recipe in ("debate", "issue_fix", "guess_number"):
        load_team(ROOT / "recipes" / f"{recipe}.yaml")
    replace_in(workspace / "echo.yaml", "max_retries: 2", "max_retries: 2\nreply_prefix: '{\"shout\": '")
    team = load_team(workspace / "team.yaml")
    monkeypatch.undo()
    build_policies(team, {"echo": parse_binding("builtin:stub"), "reviewer": parse_binding("builtin:stub")}, no_engine)
    with pytest.raises(ConfigError, match=r"echo.yaml:13: reply_prefix: reply_prefix '\{\"shout\": ' does not start"):
        build_policies(team, {}, no_engine)  # before the model loads


def test_every_role_the_model_plays_is_compiled_before_a_model_loads(workspace):
    """Only the roles before the first one bound to the model were compiled before it loaded, and
    a training run (or a population's round robin) loads its model before it binds a role."""
    from orchestrator.errors import ConfigError
    from orchestrator.rollout import build_policies
    from orchestrator.team import load_team
    from orchestrator.training.loop import check_start

    replace_in(workspace / "echo.yaml", "max_retries: 2", "max_retries: 2\nreply_prefix: '{\"shout\": '")
    replace_in(workspace / "team.yaml", "  - use: ./echo.yaml\n  - use: reviewer", "  - use: reviewer\n  - use: ./echo.yaml")
    team = load_team(workspace / "team.yaml")
    assert list(team.roles)[0] == "reviewer"
    with pytest.raises(ConfigError, match="echo.yaml:13: reply_prefix"):
        build_policies(team, {}, no_engine)
    (workspace / "team.yaml").write_text((workspace / "team.yaml").read_text() + "training:\n  steps: 1\n")
    with pytest.raises(ConfigError, match="echo.yaml:13: reply_prefix"):
        check_start(load_team(workspace / "team.yaml"), workspace / "run", resume=False)


def test_every_shipped_yaml_validates(cli):
    root = Path(__file__).resolve().parent.parent
    code, out, err = cli("validate", root / "roles", root / "recipes")
    assert code == 0, err
    assert out.count("ok") >= 11


def test_a_free_reply_prefix_may_be_loose_json_after_chatter(workspace, cli):
    """Free replies are read from their first JSON object: the prefix is judged from its "{", in any spacing."""
    replace_in(workspace / "team.yaml", "  - use: reviewer",
               "  - use: reviewer\n    decoding: free\n    reply_prefix: 'Sure. {\n  \"verdict\" :'")
    code, out, err = cli("validate", workspace / "team.yaml")
    assert code == 0, err


def test_a_team_override_replaces_a_schema_whole_and_a_yml_role_is_a_path(workspace):
    """Nested mappings merge, except an output_schema: merged, the reviewer's verdict and comments
    would stay beside `ok`, under its additionalProperties: false. A role file named .yml beside the
    team's, with no slash, is a file too, not a library name."""
    from orchestrator.team import load_team

    (workspace / "echo.yml").write_text((workspace / "echo.yaml").read_text())
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    replace_in(workspace / "team.yaml", "  - use: ./echo.yaml\n  - use: reviewer",
               f"  - use: echo.yml\n  - use: reviewer\n    output_schema: {json.dumps(schema)}")
    roles = load_team(workspace / "team.yaml").roles
    assert roles["reviewer"].schema == schema and roles["echo"].source == workspace / "echo.yml"


def test_an_error_is_one_line_whatever_its_text_holds():
    """A problem or a fault's message over several lines (pydantic's, a plugin's) is joined: the
    line is FILE:LINE: KEY: problem, and a file, line or key it lacks is left out, not empty."""
    from orchestrator.errors import ConfigError, one_line

    assert str(ConfigError("team.yaml", 3, "tasks", "first\n  second")) == "team.yaml:3: tasks: first second"
    assert str(ConfigError(None, None, "", "bad")) == "<config>: (root): bad"
    assert one_line(ValueError("2 validation errors\nsteps\n  too small")) == "ValueError: 2 validation errors steps too small"


def test_an_unknown_key_in_a_list_item_lists_the_allowed_keys_and_inputs_are_shown_short():
    from pydantic import BaseModel, ConfigDict, ValidationError
    from orchestrator.config_errors import first_error

    class Item(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: str = ""
        size: int = 0

    class Outer(BaseModel):
        items: list[Item] = []

    def error(data):
        with pytest.raises(ValidationError) as info:
            Outer.model_validate(data)
        return first_error(info.value, data, Outer)

    assert error({"items": [{}, {"nme": "x"}]}) == (("items", 1, "nme"), "unknown key (allowed: name, size)")
    assert error({"items": [{"name": None}]})[1] == "Input should be a valid string (got None)"
    assert error({"items": [{"size": "9" * 100 + "x"}]})[1].endswith(f"(got '{'9' * 56}...)")
    assert error({"items": [{"size": "9" * 57 + "x"}]})[1].endswith(f"(got '{'9' * 57}x')")  # 60 long: whole, not cut to 60


ROLE = {"name": "r", "description": "d", "prompt": "p.md.j2", "output_schema": {"type": "object"}}
TEAM = {"name": "t", "protocol": {"type": "pipeline"}, "roles": [{"use": "r"}], "tasks": [{}]}


# (model, the keys it needs, a value at the bound: kept, one past it: refused). A bound dropped or
# moved by one passed every test: tiny temperatures overflowed, 1e400 was inf, a rank past 512 ran out of memory.
BOUNDS = [
    ("LossConfig", {}, {"kl_coef": 0.0}, {"kl_coef": -0.1}),
    ("LossConfig", {}, {"entropy_coef": 0.0}, {"entropy_coef": -0.1}),
    ("LossConfig", {}, {"batch_tokens": 1e-9}, {"batch_tokens": 0}),
    ("PPOConfig", {}, {"clip_low_threshold": 1.0}, {"clip_low_threshold": 1.01}),
    ("PPOConfig", {}, {"clip_high_threshold": 1.0}, {"clip_high_threshold": 0.99}),
    ("SandboxOptions", {}, {"memory_mb": 64}, {"memory_mb": 63}),
    ("SandboxOptions", {}, {"backend": "bwrap"}, {"backend": "none"}),
    ("SamplingConfig", {}, {"temperature": 5.0}, {"temperature": 5.01}),
    ("SamplingConfig", {}, {"temperature": 1e-3}, {"temperature": 9e-4}),
    ("SamplingConfig", {}, {"top_p": 1e-6}, {"top_p": 9e-7}),
    ("SamplingConfig", {}, {"max_tokens": 32768}, {"max_tokens": 32769}),
    ("PolicyConfig", {}, {"adapter": "a-b_1"}, {"adapter": "../a"}),
    ("RoleConfig", ROLE, {"max_retries": 20}, {"max_retries": 21}),
    ("AdamConfig", {}, {"learning_rate": 1e-9}, {"learning_rate": 0}),
    ("AdamConfig", {}, {"beta2": 0.999}, {"beta2": 1.0}),
    ("AdamConfig", {}, {"eps": 1e-12}, {"eps": 0}),
    ("AdamConfig", {}, {"grad_clip_norm": 0}, {"grad_clip_norm": -1}),
    ("LoraSpec", {}, {"rank": 512}, {"rank": 513}),
    ("LoraSpec", {}, {"dropout": 0.99}, {"dropout": 1.0}),
    ("LoraSpec", {}, {"target_modules": ["q_proj"]}, {"target_modules": ["q_proj", "embed_tokens"]}),
    ("LoraSpec", {}, {"target_modules": ["q_proj"]}, {"target_modules": []}),  # `validate` passed it; training stopped at its start
    ("TrainingConfig", {}, {"ppo_epochs": 64}, {"ppo_epochs": 65}),
    ("TrainingConfig", {}, {"max_staleness": 8}, {"max_staleness": 9}),
    ("TrainingConfig", {}, {"turn_credit": 0}, {"turn_credit": -0.5}),
    ("TrainingConfig", {}, {"history_credit": 0}, {"history_credit": -0.5}),
    ("TrainingConfig", {}, {"eval_every": 0}, {"eval_every": -1}),
    ("TrainingConfig", {}, {"keep_checkpoints": 1}, {"keep_checkpoints": 0}),
    ("TeamConfig", TEAM, {"seed": 2**63 - 1}, {"seed": 2**63}),
    ("TeamConfig", TEAM, {"max_turns": 1}, {"max_turns": 0}),
    ("TeamConfig", TEAM, {"episode_timeout_s": 1e-3}, {"episode_timeout_s": 0}),
    ("TeamConfig", TEAM, {"roles": [{"use": "r"}]}, {"roles": []}),
    ("TeamConfig", TEAM, {"protocol": {"type": "my_env-2"}}, {"protocol": {"type": "my env"}}),
]


@pytest.mark.parametrize("model, needed, kept, refused", BOUNDS, ids=[f"{b[0]}.{next(iter(b[3]))}={next(iter(b[3].values()))}" for b in BOUNDS])
def test_each_bound_keeps_its_edge_and_refuses_one_past_it(model, needed, kept, refused):
    from pydantic import ValidationError
    from orchestrator import config

    cls = getattr(config, model)
    assert cls.model_validate({**needed, **kept})
    with pytest.raises(ValidationError) as info:
        cls.model_validate({**needed, **refused})
    assert info.value.errors()[0]["loc"][0] == next(iter(refused))
