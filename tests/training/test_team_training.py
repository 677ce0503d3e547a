"""The team recipes train out of the box (2 steps on the tiny model), and each trainer's effect is
read back from what the run recorded: credit.jsonl says, per step and episode, each role's
reward, the advantage the trainer gave it, and whether its adapter trained."""
from __future__ import annotations

import statistics
import zlib
from pathlib import Path

import pytest
import yaml
from support import credit, metric_rows, needs_sandbox, plugin
from support import train_tiny as train

ROOT = Path(__file__).resolve().parents[2]


def coin(*keys: object, sides: int = 2) -> int:
    """A fixed draw from ``keys``: the same in every run, spread across episodes and roles."""
    return zlib.crc32(repr(keys).encode()) % sides


@pytest.fixture
def varied_reward():
    """A reward plugin, ``varied``, in the CLI's registry, that differs across episodes and roles.
    The tiny model never passes a hidden test, so a recipe's own rewards are all 0, and every
    advantage would be 0 whatever the trainer did with them."""
    from orchestrator.registry import default_registry

    def varied(episode, roles, config):
        return {role: float(coin(episode.index, role, sides=7)) for role in roles}

    default_registry.cache_clear()
    default_registry().add_module(plugin(register_rewards=lambda register: register("varied", varied)), "varied", "test")
    yield "varied"
    default_registry.cache_clear()


def short_replies(recipe: Path, folder: Path, max_tokens: int = 48) -> Path:
    """``recipe`` with every role's replies capped at ``max_tokens``, as a file in ``folder`` (its
    prompt paths made absolute). The tiny model writes noise up to each role's cap, and
    issue_fix's caps (512 tokens for the Coder, 384 for the Tester) made its test take minutes."""
    data = yaml.safe_load(recipe.read_text())
    for role in data["roles"]:
        if "prompt" in role:
            role["prompt"] = str((recipe.parent / role["prompt"]).resolve())
        role.setdefault("policy", {}).setdefault("sampling", {})["max_tokens"] = max_tokens
    path = folder / recipe.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def spread(values: list[float]) -> list[float]:
    """``values``, checked to differ: advantages of equal rewards are 0 under any baseline."""
    assert len(set(values)) > 1, values
    return values


@pytest.mark.parametrize("recipe, adapters", [
    pytest.param("issue_fix", ["planner", "coder", "reviewer", "tester"], marks=needs_sandbox),
    pytest.param("code_pair", ["tester", "coder"], marks=needs_sandbox),
    ("prisoners_dilemma", ["alice", "bob"]),
    ("generate_judge", ["generator", "judge"]),
])
def test_team_recipes_train_every_role(cli, tmp_path, monkeypatch, recipe, adapters):
    monkeypatch.chdir(ROOT)  # issue_fix's task dirs are relative to the repo root
    run = tmp_path / "run"
    path = ROOT / "recipes" / f"{recipe}.yaml"
    train(cli, short_replies(path, tmp_path) if recipe == "issue_fix" else path, run, 2)
    assert sorted(p.name for p in (run / "sampler").iterdir()) == sorted(adapters)
    assert all((run / "sampler" / a / "adapter_model.safetensors").is_file() for a in adapters)
    assert [r["step"] for r in metric_rows(run) if r["kind"] == "train"] == [1, 2]
    # the environment's own measures ride along each evaluation, where it has some
    measure = {"generate_judge": "judge_balanced_accuracy", "issue_fix": "solved_rate"}.get(recipe)
    evals = [r for r in metric_rows(run) if r["kind"] == "eval"]
    if measure:
        assert all(0 <= r[f"eval_env/{measure}"] <= 1 for r in evals)
        code, _, err = cli("report", run)
        assert code == 0 and (run / "report" / "env.png").stat().st_size > 0, err
    else:
        assert not any(k.startswith("eval_env/") for r in evals for k in r)


def test_freeze_rotate_trains_one_player_per_phase(cli, tmp_path):
    recipe = tmp_path / "pd.yaml"
    recipe.write_text((ROOT / "recipes/prisoners_dilemma.yaml").read_text().replace("{every: 5}", "{every: 2}"))
    run = tmp_path / "run"
    train(cli, recipe, run, 4)
    # phase = (step - 1) // 2: alice at steps 1 and 2, bob at 3 and 4
    expected = {1: "alice", 2: "alice", 3: "bob", 4: "bob"}
    rows = {r["step"]: r for r in metric_rows(run) if r["kind"] == "train"}
    for step, learner in expected.items():
        lines = credit(run, step)
        assert len(lines) == 2 and all(line["trained"] == [learner] for line in lines)
        frozen = "bob" if learner == "alice" else "alice"
        assert f"{learner}/version" in rows[step] and f"{frozen}/version" not in rows[step]


def code_pair(tmp_path: Path, trainer: str, reward: str) -> Path:
    """recipes/code_pair.yaml with another trainer block line and reward, as a file in tmp_path."""
    text = (ROOT / "recipes/code_pair.yaml").read_text()
    text = text.replace("tasks: functions/train.jsonl", f"tasks: {ROOT}/recipes/functions/train.jsonl")
    text = text.replace("eval_tasks: functions/heldout.jsonl", f"eval_tasks: {ROOT}/recipes/functions/heldout.jsonl")
    text = text.replace("  reward_config: {alpha: 0.5}\n", "").replace("reward: hybrid", f"reward: {reward}")
    recipe = tmp_path / "pair.yaml"
    recipe.write_text(text.replace("trainer: grpo", trainer))
    return recipe


@needs_sandbox
@pytest.mark.parametrize("baseline", ["team", "per_role"])
def test_mgrpo_advantages_follow_its_baseline(cli, tmp_path, varied_reward, baseline):
    recipe = code_pair(tmp_path, f"trainer: m-grpo\n  trainer_config: {{baseline: {baseline}}}", varied_reward)
    run = tmp_path / "run"
    train(cli, recipe, run, 1, "--set", "group_size=4")
    lines = credit(run, 1)
    assert len(lines) == 4 and all(line["trained"] == ["coder", "tester"] for line in lines)
    team = spread([statistics.mean(line["rewards"].values()) for line in lines])
    for role in ("tester", "coder"):
        own = spread([line["rewards"][role] for line in lines])
        if baseline == "team":  # every role gets the team's reward minus the group's mean of it
            expected = [t - statistics.mean(team) for t in team]
        else:  # each role its own rewards minus their mean
            expected = [r - statistics.mean(own) for r in own]
        assert [line["advantages"][role] for line in lines] == pytest.approx(expected, abs=1e-9)


@needs_sandbox
def test_grpo_centres_each_roles_rewards_within_its_group(cli, tmp_path, varied_reward):
    run = tmp_path / "run"
    train(cli, code_pair(tmp_path, "trainer: grpo", varied_reward), run, 1, "--set", "group_size=4")
    lines = credit(run, 1)
    assert len(lines) == 4
    for role in ("tester", "coder"):
        own = spread([line["rewards"][role] for line in lines])
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


def test_teacher_student_trains_teachers_and_student_but_not_the_baseline(cli, tmp_path, monkeypatch):
    import json

    from orchestrator.envs import teacher_student

    # The tiny model never answers right, so every reward would be 0: a scripted checker instead
    # marks an answer right or wrong by its episode and role; the env's arithmetic stays its own.
    monkeypatch.setattr(teacher_student, "whole_number", lambda message: coin(message.episode, message.sender))
    for domain in ("largest", "smallest"):
        monkeypatch.setitem(teacher_student.GENERATORS, domain,
                            lambda rng: lambda r: {"text": f"problem {r.randrange(10**6)}", "answer": 1})
    run = tmp_path / "run"
    train(cli, ROOT / "recipes/teacher_student.yaml", run, 2, "--set", "groups_per_step=2")
    assert sorted(p.name for p in (run / "sampler").iterdir()) == ["student", "teacher_largest", "teacher_smallest"]
    for step in (1, 2):
        transcripts = (run / "rollouts" / f"step-{step:06d}" / "transcripts.jsonl").read_text().splitlines()
        records = {r["id"]: r for r in map(json.loads, transcripts)}
        lines = credit(run, step)
        assert len(lines) == 4
        spread([line["rewards"]["student"] - records[line["episode"]]["rewards"]["student_alone"] for line in lines])
        for line in lines:
            # student_alone samples from the student's adapter but is not trainable
            assert "student_alone" not in line["trained"] and "student" in line["trained"]
            record = records[line["episode"]]
            teacher = f"teacher_{record['outcome']['domain']}"
            assert [t["role"] for t in record["turns"]][0] == teacher
            assert line["rewards"][teacher] == pytest.approx(
                line["rewards"]["student"] - record["rewards"]["student_alone"])
        # a teacher's figure is over its own domain's episodes: the other's had added their zeros
        row = next(r for r in metric_rows(run) if (r["step"], r["kind"]) == (step, "train"))
        for teacher in ("teacher_largest", "teacher_smallest"):
            own = [line["rewards"][teacher] for line in lines if teacher in records[line["episode"]]["took_part"]]
            assert row.get(f"reward/{teacher}") == (pytest.approx(sum(own) / len(own)) if own else None)


def test_an_evaluation_where_a_role_took_no_part_gives_it_no_reward(cli, tmp_path):
    """One evaluation episode draws one domain: the other teacher took no part. Its null reward
    had crashed the run in the evaluation's log line, after the row was written."""
    run = tmp_path / "run"
    train(cli, ROOT / "recipes/teacher_student.yaml", run, 1, "--set", "eval_episodes=1")
    evals = [r for r in metric_rows(run) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 1]
    for row in evals:
        assert sorted(role for role in ("teacher_largest", "teacher_smallest") if row[f"eval_reward/{role}"] is None) \
            == ["teacher_smallest"]  # the first eval task is the largest domain's
        assert row["eval_reward/student"] is not None


def test_role_loss_config_reaches_only_that_roles_tokens(cli, tmp_path):
    run = tmp_path / "run"
    train(cli, ROOT / "recipes/propose_solve.yaml", run, 1, "--set", "role_loss_config.proposer.entropy_coef=0.1")
    (row,) = [r for r in metric_rows(run) if r["kind"] == "train"]
    assert row["proposer/entropy"] > 0 and "solver/entropy" not in row  # the bonus is computed where it is asked for
    # a role that shares its adapter (the Judge, with its worker) takes its options too
    run = tmp_path / "shared"
    train(cli, ROOT / "recipes/generate_judge_worker.yaml", run, 1, "--set", "role_loss_config.judge.kl_coef=0.5")
    (row,) = [r for r in metric_rows(run) if r["kind"] == "train"]
    assert "judge/kl" in row and "generator/kl" not in row


def test_a_metric_one_roles_call_computes_is_that_roles_tokens_mean():
    """An adapter's calls (the Judge's with kl_coef of its own, the Worker's without) are summed
    into one row: the Judge's kl is the mean over the Judge's tokens, not diluted by the Worker's."""
    from orchestrator.training.loop import _calls_summed

    row = _calls_summed([{"loss": 0.1, "loss:sum": 1.0, "tokens": 100.0, "kl": 0.2, "ratio_mean": 1.5},
                         {"loss": 0.3, "loss:sum": 3.0, "tokens": 300.0, "ratio_mean": 0.5}])
    assert row["kl"] == pytest.approx(0.2)  # was 0.05: as if the Worker's tokens had no KL
    assert row["ratio_mean"] == pytest.approx(0.75) and row["tokens"] == 400.0 and row["loss"] == pytest.approx(0.4)


def test_repetition_penalty_lowers_the_rewards_of_repeated_messages(cli, tmp_path):
    import json

    # a greedy Proposer poses one problem in every episode: each repeats all the others
    recipe = tmp_path / "propose_solve.yaml"
    recipe.write_text((ROOT / "recipes/propose_solve.yaml").read_text().replace(
        "  - use: proposer\n", "  - {use: proposer, policy: {adapter: proposer, trainable: true, sampling: {temperature: 0}}}\n"))
    run = tmp_path / "run"
    train(cli, recipe, run, 1, "--set", "repetition_penalty.proposer=0.5", "--set", "group_size=6")
    (row,) = [r for r in metric_rows(run) if r["kind"] == "train"]
    records = {r["id"]: r for r in map(json.loads, (run / "rollouts/step-000001/transcripts.jsonl").read_text().splitlines())}
    lines = credit(run, 1)
    assert len(lines) == 6 and row["proposer/repeated"] == 1.0
    for line in lines:
        env = records[line["episode"]]["rewards"]
        assert line["rewards"]["proposer"] == pytest.approx(env["proposer"] - 0.5)
        assert line["rewards"]["solver"] == env["solver"]
    assert row["env_reward/proposer"] == pytest.approx(row["reward/proposer"] + 0.5) and "solver/repeated" not in row


def test_learners_whose_adapters_differ_only_by_case_are_refused(cli, tmp_path):
    """Adapters Pro and pro: distinct folders here, one sampler/ and checkpoint folder on macOS's or
    Windows' file system, where the two debaters' weights would overwrite each other."""
    recipe = tmp_path / "debate.yaml"
    recipe.write_text((ROOT / "recipes/debate.yaml").read_text().replace("{adapter: pro}", "{adapter: Pro}")
                      .replace("{adapter: con}", "{adapter: pro}"))
    code, _, err = cli("validate", recipe)
    assert code == 2 and f"{recipe}:19: roles[1].policy.adapter: adapter 'pro' differs from 'Pro' only by case" in err, err
