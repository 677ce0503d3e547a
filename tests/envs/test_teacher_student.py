"""teacher_student: each domain's problem goes to its teacher, only the student sees the example,
and the teacher is paid the improvement its example made for a scripted student."""
from __future__ import annotations

import json
import random
import re

import pytest
from play import Script, another_shape, play, team
from support import ERROR_LINE

from orchestrator.envs.teacher_student import GENERATORS, UNITS, TeacherStudentConfig


def student(skill: str):
    """A scripted student: ``uses-examples`` is right only with an example that shows a result
    (an ``=``), ``misled`` is right only without one, ``never`` is never right."""
    def answer(request) -> str:
        prompt = request.messages[-1]["content"]
        word, numbers = re.search(r"Now solve: Which is the (largest|smallest): ([\d, ]+)\?", prompt).groups()
        shown = "=" in prompt.split("Now solve:")[0]
        right = {"uses-examples": shown, "misled": "worked example" not in prompt, "never": False}[skill]
        pick = max if word == "largest" else min
        return json.dumps({"answer": pick(map(int, numbers.split(","))) if right else -1})
    return answer


@pytest.mark.parametrize("example, skill, rewards", [
    ("largest of 2, 7, 3 = 7", "uses-examples", {"student": 1.0, "teacher_largest": 1.0, "student_alone": 0.0}),
    ("largest of 2, 7, 3", "uses-examples", {"student": 0.0, "teacher_largest": 0.0, "student_alone": 0.0}),
    ("largest of 2, 7, 3 = 7", "misled", {"student": 0.0, "teacher_largest": -1.0, "student_alone": 1.0}),
    ("largest of 2, 7, 3 = 7", "never", {"student": 0.0, "teacher_largest": 0.0, "student_alone": 0.0}),
])
def test_the_teacher_earns_the_improvement_its_example_made(tmp_path, example, skill, rewards):
    t = team("teacher_student", tasks=[{"domain": "largest"}])
    teacher = Script({"example": example})
    policy = student(skill)
    (ep,) = play(t, {"teacher_largest": teacher, "teacher_smallest": Script(), "student": policy,
                     "student_alone": policy}, tmp_path).episodes
    assert ep.status == "ok", ep.error
    assert [turn.role for turn in ep.turns] == ["teacher_largest", "student", "student_alone"]
    assert ep.rewards == {**rewards, "teacher_smallest": 0.0}
    assert ep.outcome["worked"] != ep.outcome["problem"] and ep.outcome["example"] == example


def test_problems_go_to_their_domains_teacher_and_only_the_student_sees_the_example(tmp_path):
    t = team("teacher_student", tasks=[{"domain": "largest"}, {"domain": "smallest"}])
    teachers = {"teacher_largest": Script(*[{"example": "MAX-EXAMPLE"}] * 2),
                "teacher_smallest": Script(*[{"example": "MIN-EXAMPLE"}] * 2)}
    seen: dict[str, list[str]] = {"student": [], "student_alone": []}

    def recorder(role):
        def answer(request):
            seen[role].append(json.dumps(request.messages))
            return json.dumps({"answer": 0})
        return answer

    episodes = play(t, {**teachers, "student": recorder("student"), "student_alone": recorder("student_alone")},
                    tmp_path, episodes=4).episodes
    assert [ep.turns[0].role for ep in episodes] == ["teacher_largest", "teacher_smallest"] * 2
    assert [ep.outcome["domain"] for ep in episodes] == ["largest", "smallest"] * 2
    assert len(seen["student"]) == 4 and all("EXAMPLE" in s for s in seen["student"])
    assert len(seen["student_alone"]) == 4 and not any("EXAMPLE" in s for s in seen["student_alone"])
    assert all("smallest" in ep.outcome["problem"]["text"] for ep in episodes[1::2])


def test_a_teacher_is_measured_on_its_own_domains_episodes_alone(tmp_path):
    """The other domain's teacher sits an episode out, its 0 in the rewards no result: the summary's
    mean reward and eval's W-D-L had counted it (half the teacher's effect, and a draw each)."""
    from orchestrator.evaluation import evaluate

    t = team("teacher_student", tasks=[{"domain": "largest"}, {"domain": "smallest"}])
    teacher = Script(*[{"example": "largest of 2, 7, 3 = 7"}] * 2)
    result = play(t, {"teacher_largest": teacher, "teacher_smallest": Script(*[{"example": "x"}] * 2),
                      "student": student("uses-examples"), "student_alone": student("uses-examples")},
                  tmp_path, episodes=4)
    assert [ep.took_part for ep in result.episodes[:2]] == [
        ["teacher_largest", "student", "student_alone"], ["teacher_smallest", "student", "student_alone"]]
    roles = result.summary["roles"]
    assert roles["teacher_largest"]["mean_reward"] == 1.0 and roles["student"]["mean_reward"] == 0.5
    report = evaluate(t, result.episodes, result.summary)
    assert (report["teacher_largest"]["games"], report["teacher_largest"]["win"]) == (2, 2)
    assert (report["student"]["games"], report["student"]["win"]) == (4, 2)


@pytest.mark.parametrize("domain", sorted(GENERATORS))
def test_generators_give_same_shape_problems_with_right_answers(domain):
    rng = random.Random(0)
    for _ in range(50):
        draw = GENERATORS[domain](rng)
        p, q = draw(rng), draw(rng)
        assert isinstance(p["answer"], int) and isinstance(q["answer"], int)
        if domain == "addition":
            assert eval(p["text"]) == p["answer"]  # "a + b"
        elif domain == "sequences":
            terms = [int(x) for x in re.findall(r"\d+", p["text"])]
            assert p["answer"] - terms[-1] == terms[1] - terms[0] == terms[3] - terms[2]
            assert terms[1] - terms[0] == [int(x) for x in re.findall(r"\d+", q["text"])][1] - int(re.findall(r"\d+", q["text"])[0])
        elif domain in ("largest", "smallest"):
            numbers = [int(x) for x in re.findall(r"\d+", p["text"])]
            assert len(set(numbers)) == 3 and p["answer"] == (max if domain == "largest" else min)(numbers)
            assert domain in p["text"] and domain in q["text"]
        else:  # "How many cm are in 7 m?"
            small, n, big = re.fullmatch(r"How many (\w+) are in (\d+) (\w+)\?", p["text"]).groups()
            assert p["answer"] == int(n) * {(b, s): f for b, s, f in UNITS}[(big, small)]
            assert p["text"].split(" are in ")[0] == q["text"].split(" are in ")[0]  # the same unit pair


@pytest.mark.parametrize("edit, message", [
    ("domains: {}", "at least 1 item"),
    ("domains: {algebra: teacher_largest}",
     "unknown domain(s) algebra (known: addition, sequences, units, largest, smallest)"),
])
def test_bad_domains_are_one_line_at_validate(cli, tmp_path, edit, message):
    from play import ROOT

    text = (ROOT / "recipes/teacher_student.yaml").read_text()
    text = re.sub(r"  domains:\n(    .*\n)+", f"  {edit}\n", text)
    path = tmp_path / "ts.yaml"
    path.write_text(text)
    code, _, err = cli("validate", path)
    assert code == 2
    (line,) = [x for x in err.splitlines() if x.strip()]
    m = ERROR_LINE.match(line)
    assert m and m["file"] == str(path) and m["line"] == "17" and m["key"] == "protocol.domains"
    assert message in m["problem"]


def test_a_task_given_as_text_is_its_domain(tmp_path):
    """``rolecast run recipes/teacher_student.yaml --task smallest``: every episode is that domain's."""
    import rolecast
    from play import ROOT

    recipe = ROOT / "recipes/teacher_student.yaml"
    policies = {role: "builtin:random" for role in ("teacher_largest", "teacher_smallest", "student", "student_alone")}
    result = rolecast.run(recipe, tasks=["smallest"], episodes=6, policies=policies, out=tmp_path / "run", progress=False)
    assert [ep.outcome["domain"] for ep in result.episodes] == ["smallest"] * 6
    with pytest.raises(rolecast.RolecastError, match="--task cubes: domain: domain 'cubes' has no teacher"):
        rolecast.run(recipe, tasks=["cubes"], policies=policies, out=tmp_path / "run2", progress=False)


def test_the_teacher_works_the_other_problem_not_the_students(tmp_path):
    t = team("teacher_student", tasks=[{"domain": "largest"}])
    teacher, answers = Script(*[{"example": "x"}] * 4), Script(*[{"answer": 0}] * 8)
    episodes = play(t, {"teacher_largest": teacher, "teacher_smallest": Script(), "student": answers,
                        "student_alone": answers}, tmp_path, episodes=4).episodes
    worked = {r.episode: r.context["problem"] for r in teacher.requests}
    solved = {r.episode: r.context["problem"] for r in answers.requests}
    for ep in episodes:
        assert worked[ep.id] == ep.outcome["worked"]["text"] != solved[ep.id] == ep.outcome["problem"]["text"]


@pytest.mark.parametrize("domain, values", [
    ("addition", lambda p: {p["text"]}),
    ("sequences", lambda p: {(p["answer"] - int(p["text"].split(", ")[-2]), int(re.findall(r"\d+", p["text"])[0]))}),
    ("units", lambda p: {p["text"]}),
    ("largest", lambda p: {int(x) for x in re.findall(r"\d+", p["text"])}),
])
def test_generators_draw_their_whole_range(domain, values):
    """Every sum of one-digit numbers, step 1..3 from every start 1..12, unit pair and count 2..12, and
    number 1..59 comes up."""
    rng, seen = random.Random(0), set()
    for _ in range(2000):
        seen |= values(GENERATORS[domain](rng)(rng))
    assert seen == {"addition": {f"{a} + {b}" for a in range(1, 10) for b in range(1, 10)}, "sequences": {(step, start) for step in (1, 2, 3) for start in range(1, 13)},
                    "largest": set(range(1, 60)),
                    "units": {f"How many {s} are in {n} {b}?" for b, s, _ in UNITS for n in range(2, 13)}}[domain]


def test_the_problem_is_never_the_worked_one_and_addition_is_one_digit():
    from orchestrator.envs.teacher_student import TeacherStudentEnv

    t = team("teacher_student")
    config = TeacherStudentConfig(domains={"addition": "teacher_largest"})
    for seed in range(300):  # 81 sums: the second draw repeats the first in about 4 of these
        env = TeacherStudentEnv(config, t.roles, {}, random.Random(seed))
        assert env.worked != env.problem and env.domain == "addition"
        assert all(1 <= int(x) <= 9 for p in (env.worked, env.problem) for x in p["text"].split(" + "))


def test_a_problem_is_drawn_again_until_it_differs_from_the_worked_one(monkeypatch):
    """Not only once: a second draw like the worked problem is no more the student's than the first."""
    from orchestrator.envs import teacher_student

    same, other = {"text": "1 + 1", "answer": 2}, {"text": "1 + 2", "answer": 3}
    draws = iter([same, same, same, other])
    monkeypatch.setitem(teacher_student.GENERATORS, "addition", lambda rng: lambda r: next(draws))
    config = TeacherStudentConfig(domains={"addition": "teacher_largest"})
    env = teacher_student.TeacherStudentEnv(config, team("teacher_student").roles, {}, random.Random(0))
    assert (env.worked, env.problem) == (same, other)


def test_a_task_without_a_domain_draws_one(tmp_path):
    t = team("teacher_student", tasks=[{}])
    teachers = {r: Script(*[{"example": "x"}] * 20) for r in ("teacher_largest", "teacher_smallest")}
    answer = Script(*[{"answer": 0}] * 20)
    episodes = play(t, {**teachers, "student": answer, "student_alone": answer}, tmp_path, episodes=20).episodes
    assert {ep.outcome["domain"] for ep in episodes} == {"largest", "smallest"}


def test_the_example_is_trimmed_and_a_blank_one_is_none(tmp_path):
    t = team("teacher_student", tasks=[{"domain": "largest"}])
    for example, kept in [("  largest of 2, 7 = 7 ", "largest of 2, 7 = 7"), ("   ", None)]:
        teacher = Script({"example": example})
        answers = Script({"answer": 5}, {"answer": -1})
        (ep,) = play(t, {"teacher_largest": teacher, "teacher_smallest": Script(), "student": answers,
                         "student_alone": answers}, tmp_path).episodes
        assert ep.outcome["example"] == kept and ep.outcome["answers"] == {"student": 5, "student_alone": -1}


@pytest.mark.parametrize("student, alone, teacher", [("s", "s", "t"), ("s", "a", "s"), ("s", "a", "a")])
def test_the_students_and_the_teachers_are_different_roles(student, alone, teacher):
    with pytest.raises(ValueError, match="student, student_alone and the teachers must be different roles"):
        TeacherStudentConfig(student=student, student_alone=alone, domains={"largest": teacher})
    TeacherStudentConfig(student="s", student_alone="a", domains={"largest": "t"})


@pytest.mark.parametrize("role, other, field", [("teacher_largest", "student", "example"),
                                                ("student_alone", "teacher", "answer")])
def test_roles_of_another_shape_are_refused_at_load(tmp_path, role, other, field):
    """A teacher with a student's schema loaded, then showed no example in any episode."""
    from orchestrator.errors import ConfigError
    from orchestrator.team import load_team

    with pytest.raises(ConfigError, match=rf"TeacherStudentEnv reads field\(s\) {field} of the messages of role '{role}'"):
        load_team(another_shape(tmp_path, "teacher_student", role, other))
