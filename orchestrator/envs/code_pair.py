"""``code_pair``: a Tester and a Coder write a one-line Python function from a spec, graded by
hidden tests in the sandbox. Small enough for a 135M model to learn on a CPU.

    protocol:
      type: code_pair
      tester: tester            # writes one example call and its result, from the spec
      coder: coder              # sees the spec and that example; writes the function
      sandbox: {backend: auto, timeout_s: 10}

A task is ``{"spec": "Return x plus 3.", "tests": [[1, 4], [10, 13]], "reference": "x + 3"}``:
``tests`` are (input, expected output) pairs of JSON values, ``reference`` a correct return
expression of ``x`` (the recipe author's code: it runs on the host). Both messages are code, the
form a small model writes best: the Tester's is ``{"example": "f(2) == 5"}`` (a call with a
literal argument, compared with a literal), the Coder's ``{"code": "def f(x): return x + 3"}``,
run in the sandbox on the hidden tests' inputs.

Rewards: every role gets the team outcome, the share of hidden tests the function passes. The
process rewards beside it (``outcome()["process"]``): the Tester's is 1 for a correct example
(a valid call whose output the reference gives), the Coder's the outcome itself.
"""
from __future__ import annotations

import ast
import asyncio
import json
import sys
from typing import Any, ClassVar

from pydantic import Field, StrictStr, field_validator, model_validator

from sandboxes import Limits, shared_pool
from sandboxes.pool import new_temporary_dir, remove_tree

from ..config import SandboxOptions
from ..files import writing
from ..messages import Message
from ..yamlfile import Loc
from .base import Env, EnvConfig, StepResult, TaskConfig

MARK = "@@rolecast-check "
# Runs in the sandbox: the team's function on each test input, printed as one marked JSON line
# (after whatever the function printed). The expected outputs never enter the sandbox (it sees
# none of the host's recipes, tasks files or run records either), so a function that forges this
# line still has to compute the right values to pass.
CHECKER = r'''
import json
MARK = __MARK__
job = json.load(open("job.json"))
out = {"results": [], "error": None}
try:
    scope = {}
    exec(compile(job["code"], "<team>", "exec"), scope)
    for given in job["inputs"]:
        try:
            out["results"].append([True, json.dumps(scope["f"](given))])
        except Exception as exc:
            out["results"].append([False, type(exc).__name__])
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print("\n" + MARK + json.dumps(out))
'''.replace("__MARK__", repr(MARK))


class CodePairConfig(EnvConfig):
    invalid_turns: ClassVar[str] = "an invalid example is no example, an invalid function passes no test"
    tester: str = "tester"
    coder: str = "coder"
    sandbox: SandboxOptions = Field(default_factory=lambda: SandboxOptions(timeout_s=10.0, memory_mb=256))

    @model_validator(mode="after")
    def _two_roles(self) -> "CodePairConfig":
        if self.tester == self.coder:
            raise ValueError("tester and coder must be different roles")
        return self

    def role_refs(self) -> list[tuple[Loc, str]]:
        return [(("tester",), self.tester), (("coder",), self.coder)]


class CodePairTask(TaskConfig):
    spec: StrictStr
    reference: StrictStr  # a return expression of x
    tests: list[tuple[Any, Any]] = Field(min_length=1)  # (input, expected output) pairs

    @field_validator("reference")
    @classmethod
    def _expression(cls, value: str) -> str:
        try:
            compile(f"lambda x: {value}", "<reference>", "eval")
        except SyntaxError as exc:
            raise ValueError(f"not a Python expression of x: {exc.msg}") from None
        return value


class CodePairEnv(Env):
    Config = CodePairConfig
    Task = CodePairTask
    observation_keys = frozenset({"spec", "example"})
    config: CodePairConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.order = [self.config.tester, self.config.coder]
        self.example: str | None = None  # the Tester's example as it wrote it
        self.result: dict[str, Any] = {}

    def next_role(self) -> str | None:
        return self.order[0] if self.order else None

    @classmethod
    def reads(cls, config: CodePairConfig, role: str) -> dict[str, list[Any] | None]:
        return {"example": None} if role == config.tester else {"code": None} if role == config.coder else {}

    def observe(self, role: str) -> dict[str, Any]:
        return {"spec": self.task["spec"], "example": self.example if role == self.config.coder else None}

    async def step(self, role: str, message: Message) -> StepResult:
        self.order.pop(0)
        # a schema may leave the field out of `required`: a message without it has no example, no function
        content = (message.content or {}) if message.valid else {}
        if role == self.config.tester:
            self.example = content.get("example")
            return StepResult()
        code = content.get("code")
        passed, error = await self._run_tests(code) if code is not None else (0, "no valid function")
        outcome = passed / len(self.task["tests"])
        correct = self._example_correct()
        c = self.config
        self.result = {"outcome": outcome, "passed": passed, "total": len(self.task["tests"]), "error": error,
                       "example_correct": correct, "process": {c.tester: float(correct), c.coder: outcome}}
        return StepResult(rewards={name: outcome for name in self.roles}, done=True)

    def outcome(self) -> dict[str, Any]:
        return {"spec": self.task["spec"], **self.result}

    def _example_correct(self) -> bool:
        """Whether the Tester's ``f(A) == B`` holds for the reference. A and B must be literals
        (parsed, never run; the example is at most 60 characters, its schema) and the reference
        is the recipe's own expression, so this runs here, not in the sandbox."""
        if self.example is None:
            return False
        try:
            given, said = parse_example(self.example)
            reference = eval(f"lambda x: {self.task['reference']}")  # the recipe's code
            return same(reference(given), said)
        except Exception:  # not an example of that shape, or a call the reference refuses
            return False

    async def _run_tests(self, code: str) -> tuple[int, str | None]:
        """How many hidden tests the function passes, and why it failed to run (if it did)."""
        tests = self.task["tests"]
        job = {"code": code, "inputs": [given for given, _ in tests]}
        box = self.config.sandbox
        workdir = new_temporary_dir("rolecast-code-pair-")
        try:
            with writing(workdir):  # a full TMPDIR's "No space left on device" says where
                (workdir / "job.json").write_text(json.dumps(job))
                (workdir / "check.py").write_text(CHECKER)
            limits = Limits(wall_time_s=box.timeout_s or 10.0, memory_mb=box.memory_mb)
            res = await shared_pool(box.backend, box.max_concurrent).run([sys.executable, "check.py"], workdir, limits)
        finally:
            # rm, not rmtree: a function nesting folders ~1000 deep made rmtree raise RecursionError,
            # an errored episode instead of a score, and the folder stayed behind
            await asyncio.to_thread(remove_tree, workdir)
        marked = [line for line in res.stdout.splitlines() if line.startswith(MARK)]
        try:
            out = json.loads(marked[-1][len(MARK):])
            results = out["results"][:len(tests)]
            passed = sum(ok and same(json.loads(value), expected) for (ok, value), (_, expected) in zip(results, tests))
            return passed, out.get("error")
        # a timeout, a crash, output that is not ours (a forged line nested past json's recursion limit too)
        except (ValueError, IndexError, KeyError, TypeError, RecursionError):
            if res.timed_out:
                return 0, "timed out"
            if res.out_of_memory:  # else "the check failed (exit 137)", a kill -9's words
                return 0, f"out of memory (the sandbox allows {limits.memory_mb} MB)"
            if res.truncated:  # the report comes last: cut off with the rest
                return 0, f"the function printed more than the sandbox keeps ({limits.max_output_bytes} bytes)"
            return 0, f"the check failed (exit {res.exit_code})"


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values are: Python's ``True == 1`` would pass a bool where a number is due, and
    its ``(2, 1) != [2, 1]`` fail a reference's tuple (``divmod(x, 3)``) where the example has a list."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def parse_example(text: str) -> tuple[Any, Any]:
    """``f(A) == B`` -> (A, B), both Python literals; ValueError for anything else."""
    node = ast.parse(text.strip(), mode="eval").body
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)
            and isinstance(node.left, ast.Call) and isinstance(node.left.func, ast.Name) and node.left.func.id == "f"
            and len(node.left.args) == 1 and not node.left.keywords):
        raise ValueError(f"not an example of the form f(A) == B: {text!r}")
    return ast.literal_eval(node.left.args[0]), ast.literal_eval(node.comparators[0])
