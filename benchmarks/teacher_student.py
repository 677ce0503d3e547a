"""How far a worked example can move the student: the most a teacher can earn, per domain.

In the ``teacher_student`` protocol a teacher is paid (student right with its example) minus
(student right without one). For every domain the student (``recipes/teacher_student.yaml``'s
student role, at its temperature) answers the same problems, with the same sampling seeds, three
ways in one invocation:

- ``right_example``: after a scripted teacher's right worked example ("<problem> Answer: <n>.",
  or with ``--example-format bare`` "<problem> <n>");
- ``model_teacher``: after the untrained model teacher's example (where training starts);
- ``none``: with no example (``student_alone``, in the scripted run's episodes).

``right_example - none`` bounds what a teacher of the domain can earn by writing good examples;
where it is not above zero the student cannot use an example and no teacher can learn there.

    python benchmarks/teacher_student.py [--model smollm2-135m] [--episodes 64] [--example-format answer|bare] [--smoke]

``--episodes``: per domain. ``--smoke``: the tiny model, 2 episodes a domain (tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path

import yaml

from orchestrator.cli.flags import positive_int
from orchestrator.engines.load import load_engine
from orchestrator.envs.teacher_student import GENERATORS, UNITS
from orchestrator.policies.python import PythonPolicy
from orchestrator.rollout import RunOptions, build_policies, run_team
from orchestrator.team import load_team

ROOT = Path(__file__).resolve().parent.parent


def solve(text: str) -> int:
    """The answer to a generated problem, read from its text alone (as a teacher must)."""
    if m := re.fullmatch(r"(\d+) \+ (\d+)", text):
        return int(m[1]) + int(m[2])
    if m := re.fullmatch(r"What comes next: ([\d, ]+), \?", text):
        terms = [int(t) for t in m[1].split(",")]
        return terms[-1] + terms[1] - terms[0]
    if m := re.fullmatch(r"Which is the (largest|smallest): ([\d, ]+)\?", text):
        return (max if m[1] == "largest" else min)(int(t) for t in m[2].split(","))
    if m := re.fullmatch(r"How many (\w+) are in (\d+) (\w+)\?", text):
        (factor,) = [f for big, small, f in UNITS if (small, big) == (m[1], m[3])]
        return int(m[2]) * factor
    raise ValueError(f"no solver for problem {text!r}")


FORMATS = {"answer": "{problem} Answer: {n}.", "bare": "{problem} {n}"}


def right_example(form: str):
    def teacher(request) -> str:
        problem = request.context["problem"]
        return json.dumps({"example": FORMATS[form].format(problem=problem, n=solve(problem))})
    return teacher


def team_file(folder: Path) -> Path:
    """The recipe with every domain and a teacher role for each."""
    recipe = yaml.safe_load((ROOT / "recipes/teacher_student.yaml").read_text())
    students = [r for r in recipe["roles"] if r["use"] == "student"]
    recipe["protocol"]["domains"] = {d: f"teacher_{d}" for d in GENERATORS}
    recipe["roles"] = [{"use": "teacher", "name": f"teacher_{d}", "policy": {"adapter": f"teacher_{d}"}}
                       for d in GENERATORS] + students
    recipe["tasks"] = [{"domain": d} for d in GENERATORS]
    recipe.pop("training")
    path = folder / "teacher_student_all.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def accuracy(episodes, role: str) -> dict[str, float]:
    right: dict[str, list[bool]] = {d: [] for d in GENERATORS}
    for ep in episodes:
        right[ep.outcome["domain"]].append(ep.outcome["answers"].get(role) == ep.outcome["problem"]["answer"])
    return {d: sum(r) / max(len(r), 1) for d, r in right.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=positive_int, default=64, help="episodes per domain")
    parser.add_argument("--example-format", choices=sorted(FORMATS), default="answer",
                        help="how the scripted teacher writes its example")
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.episodes = "tiny", 2
    with tempfile.TemporaryDirectory(prefix="teacher-student-") as tmp:
        team = load_team(team_file(Path(tmp)))
        engine = load_engine(args.model, "auto", 0, "hf", {}, "cpu")
        teachers = [f"teacher_{d}" for d in GENERATORS]

        async def run(scripted: bool, out: str):
            policies = build_policies(team, {}, lambda: engine)
            if scripted:
                policies.update({t: PythonPolicy(right_example(args.example_format)) for t in teachers})
            result = await run_team(team, policies, RunOptions(
                episodes=args.episodes * len(GENERATORS), seed=0, out_dir=Path(tmp) / out, progress=False))
            bad = [ep.error for ep in result.episodes if ep.status != "ok"]
            if bad:
                sys.exit(f"{len(bad)} episodes failed: {bad[0]}")
            return result.episodes

        async def both():
            try:
                return await run(True, "right"), await run(False, "model")
            finally:
                await engine.aclose()

        right, model = asyncio.run(both())
    form = FORMATS[args.example_format]
    wrong = [w for w, e in ((ep.outcome["worked"], ep.outcome["example"]) for ep in right)
             if e != form.format(problem=w["text"], n=w["answer"])]
    if wrong:
        sys.exit(f"the scripted teacher solved {wrong[0]} wrong")
    with_right, with_model = accuracy(right, "student"), accuracy(model, "student")
    none = accuracy(right, "student_alone")
    print(json.dumps({
        "model": args.model, "episodes_per_domain": args.episodes, "example_format": args.example_format,
        "student_temperature": team.roles["student"].config.policy.sampling.temperature,
        "per_domain": {d: {"right_example": round(with_right[d], 3), "model_teacher": round(with_model[d], 3),
                           "none": round(none[d], 3), "ceiling": round(with_right[d] - none[d], 3),
                           "start": round(with_model[d] - none[d], 3)} for d in GENERATORS},
    }))


if __name__ == "__main__":
    main()
