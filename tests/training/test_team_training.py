"""The team recipes train out of the box (2 steps on the tiny model), and each trainer's effect is
read back from what the run recorded: credit.jsonl says, per step and episode, each role's
reward, the advantage the trainer gave it, and whether its adapter trained."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from support import credit, metric_rows, needs_sandbox
from support import train_tiny as train

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("recipe, adapters", [
    pytest.param("issue_fix", ["planner", "coder", "reviewer", "tester"], marks=needs_sandbox),
    pytest.param("code_pair", ["tester", "coder"], marks=needs_sandbox),
    ("prisoners_dilemma", ["alice", "bob"]),
    ("generate_judge", ["generator", "judge"]),
])
def test_team_recipes_train_every_role(cli, tmp_path, monkeypatch, recipe, adapters):
    monkeypatch.chdir(ROOT)  # issue_fix's task dirs are relative to the repo root
    run = tmp_path / "run"
    train(cli, ROOT / "recipes" / f"{recipe}.yaml", run, 2)
    assert sorted(p.name for p in (run / "sampler").iterdir()) == sorted(adapters)
    assert all((run / "sampler" / a / "adapter_model.safetensors").is_file() for a in adapters)
    assert [r["step"] for r in metric_rows(run) if r["kind"] == "train"] == [1, 2]


def test_freeze_rotate_trains_one_player_per_phase(cli, tmp_path):
    recipe = tmp_path / "pd.yaml"
    recipe.write_text((ROOT / "recipes/prisoners_dilemma.yaml").read_text().replace("{every: 5}", "{every: 2}"))
    run = tmp_path / "run"
    train(cli, recipe, run, 4)
    # phase = step // 2: alice at step 1, bob at 2 and 3, alice at 4
    expected = {1: "alice", 2: "bob", 3: "bob", 4: "alice"}
    rows = {r["step"]: r for r in metric_rows(run) if r["kind"] == "train"}
    for step, learner in expected.items():
        lines = credit(run, step)
        assert len(lines) == 2 and all(line["trained"] == [learner] for line in lines)
        frozen = "bob" if learner == "alice" else "alice"
        assert f"{learner}/version" in rows[step] and f"{frozen}/version" not in rows[step]


@needs_sandbox
@pytest.mark.parametrize("baseline", ["team", "per_role"])
def test_mgrpo_advantages_follow_its_baseline(cli, tmp_path, baseline):
    recipe = tmp_path / "pair.yaml"
    text = (ROOT / "recipes/code_pair.yaml").read_text()
    text = text.replace("tasks: functions/train.jsonl", f"tasks: {ROOT}/recipes/functions/train.jsonl")
    text = text.replace("eval_tasks: functions/heldout.jsonl", f"eval_tasks: {ROOT}/recipes/functions/heldout.jsonl")
    recipe.write_text(text.replace("trainer: grpo", f"trainer: m-grpo\n  trainer_config: {{baseline: {baseline}}}"))
    run = tmp_path / "run"
    train(cli, recipe, run, 1, "--set", "group_size=4")
    lines = credit(run, 1)
    assert len(lines) == 4 and all(line["trained"] == ["coder", "tester"] for line in lines)
    for role in ("tester", "coder"):
        if baseline == "team":  # every role gets the team's reward minus the group's mean of it
            team = [statistics.mean(line["rewards"].values()) for line in lines]
            expected = [t - statistics.mean(team) for t in team]
        else:  # each role its own rewards minus their mean
            own = [line["rewards"][role] for line in lines]
            expected = [r - statistics.mean(own) for r in own]
        assert [line["advantages"][role] for line in lines] == pytest.approx(expected, abs=1e-9)


@needs_sandbox
def test_grpo_centres_each_roles_rewards_within_its_group(cli, tmp_path):
    run = tmp_path / "run"
    train(cli, ROOT / "recipes/code_pair.yaml", run, 1, "--set", "group_size=4")
    lines = credit(run, 1)
    assert len(lines) == 4
    for role in ("tester", "coder"):
        own = [line["rewards"][role] for line in lines]
        assert [line["advantages"][role] for line in lines] == pytest.approx([r - statistics.mean(own) for r in own])


def test_self_play_trains_only_the_learner_against_a_snapshot(cli, tmp_path):
    recipe = tmp_path / "rps.yaml"
    text = (ROOT / "recipes/rps.yaml").read_text()
    recipe.write_text(text.replace("snapshot_every: 5", "snapshot_every: 1, latest_prob: 0.0"))
    run = tmp_path / "run"
    train(cli, recipe, run, 2)
    assert all(line["trained"] == ["alice", "bob"] for line in credit(run, 1))  # no snapshot yet: both sides learn
    second = credit(run, 2)  # every opponent is the step-1 snapshot: only the learner's side learns
    assert len(second) == 2 and [line["trained"] for line in second] == [["alice"], ["bob"]]


def test_teacher_student_trains_teachers_and_student_but_not_the_baseline(cli, tmp_path):
    import json

    run = tmp_path / "run"
    train(cli, ROOT / "recipes/teacher_student.yaml", run, 2, "--set", "groups_per_step=2")
    assert sorted(p.name for p in (run / "sampler").iterdir()) == ["student", "teacher_largest", "teacher_smallest"]
    for step in (1, 2):
        transcripts = (run / "rollouts" / f"step-{step:06d}" / "transcripts.jsonl").read_text().splitlines()
        records = {r["id"]: r for r in map(json.loads, transcripts)}
        lines = credit(run, step)
        assert len(lines) == 4
        for line in lines:
            # student_alone samples from the student's adapter but is not trainable
            assert "student_alone" not in line["trained"] and "student" in line["trained"]
            record = records[line["episode"]]
            teacher = f"teacher_{record['outcome']['domain']}"
            assert [t["role"] for t in record["turns"]][0] == teacher
            assert line["rewards"][teacher] == pytest.approx(
                line["rewards"]["student"] - record["rewards"]["student_alone"])
