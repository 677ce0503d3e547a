"""`rolecast compare`: one recipe trained several ways with the same seed and budget."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from orchestrator.team import load_team
from orchestrator.training.strategies import SHARED_ADAPTER, STRATEGIES, with_strategy
from support import train_recipe, write

ROOT = Path(__file__).resolve().parent.parent.parent


def test_each_strategy_changes_only_how_the_team_learns(tmp_path):
    team = load_team(train_recipe(tmp_path, 3))
    for name in STRATEGIES:
        changed = with_strategy(team, name, every=4)
        t = changed.config.training
        assert (t.steps, t.group_size, t.reward) == (team.config.training.steps, team.config.training.group_size, "env")
    trainers = {name: (t.trainer, t.trainer_config) for name in STRATEGIES
                for t in [with_strategy(team, name, every=4).config.training]}
    assert trainers == {"grpo": ("grpo", {}), "freeze-rotate": ("freeze-rotate", {"every": 4}),
                        "m-grpo": ("m-grpo", {"baseline": "team"}),
                        "dr-mas": ("m-grpo", {"baseline": "per_role", "scale_std": True}), "shared": ("grpo", {})}
    shared = with_strategy(team, "shared")
    assert {n: s.config.policy.adapter for n, s in shared.roles.items()} == {"pro": SHARED_ADAPTER, "con": SHARED_ADAPTER,
                                                                              "judge": None}
    assert {n: s.config.policy.adapter for n, s in team.roles.items()}["pro"] == "pro"  # the recipe is untouched
    with pytest.raises(ValueError, match="unknown strategy"):
        with_strategy(team, "ppo")
    untrained = dataclasses.replace(team, config=team.config.model_copy(update={"training": None}))
    with pytest.raises(ValueError, match="the recipe has no `training:` block"):
        with_strategy(untrained, "grpo")


def test_shared_leaves_a_role_bound_elsewhere_as_it_is(tmp_path):
    """A role with an adapter but bound to a builtin does not learn; ``shared`` once gave it the
    shared adapter and dropped its binding, so the model played it and it learned."""
    for adapter in ("con", "pro"):  # pro's: a learner's adapter, which a frozen role on it would follow
        recipe = train_recipe(tmp_path / adapter, 1)
        recipe.write_text(recipe.read_text().replace("policy: {adapter: con,", f"policy: {{adapter: {adapter}, bind: 'builtin:stub',"))
        team = load_team(recipe)
        shared = with_strategy(team, "shared")
        assert shared.roles["con"] is team.roles["con"] and str(shared.roles["con"].binding) == "builtin:stub"
        assert shared.roles["pro"].config.policy.adapter == SHARED_ADAPTER


def test_shared_moves_a_frozen_role_on_a_learners_adapter_with_it():
    """teacher_student's student_alone samples the student's adapter, never trained, as the
    no-example baseline; ``shared`` moved the student to the shared adapter and left student_alone
    on ``student``, which nothing trains: the teachers were paid the student's training."""
    team = load_team(ROOT / "recipes/teacher_student.yaml")
    shared = with_strategy(team, "shared")
    assert shared.roles["student_alone"].config.policy.adapter == SHARED_ADAPTER
    assert not shared.roles["student_alone"].config.policy.trainable
    assert shared.roles["student_alone"].config.policy.sampling == team.roles["student_alone"].config.policy.sampling


def test_compare_trains_each_strategy_and_plots_them(cli, tmp_path):
    out = tmp_path / "cmp"
    code, stdout, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "grpo", "--strategy", "shared",
                            "--model", "tiny", "--dtype", "float32", "--out", out, "--no-progress",
                            "--set", "eval_episodes=2")
    assert code == 0, err
    result = json.loads(stdout.strip().splitlines()[-1])
    assert sorted(result["strategies"]) == ["grpo", "shared"]
    for name in ("grpo", "shared"):
        curve = result["strategies"][name]["pro"]
        assert [p["step"] for p in curve] == [0, 1] and all(-1.0 <= p["reward"] <= 1.0 for p in curve)
    assert sorted(p.name for p in (out / "grpo" / "sampler").iterdir()) == ["con", "pro"]
    assert sorted(p.name for p in (out / "shared" / "sampler").iterdir()) == [SHARED_ADAPTER]
    assert (out / "compare.png").stat().st_size > 0 and (out / "compare.json").exists()
    # run again, it resumes each strategy as it was started: other options stop it before anything trains ...
    metrics = (out / "grpo" / "metrics.jsonl").read_text()
    code, _, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "grpo", "--strategy", "shared",
                       "--out", out, "--no-progress", "--set", "eval_episodes=3")
    assert code == 2 and "was started with training.eval_episodes = 2, this command has 3" in err, err
    assert (out / "grpo" / "metrics.jsonl").read_text() == metrics
    # ... and the model it recorded is the default for the steps it adds
    code, stdout, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "grpo", "--steps", "2",
                            "--dtype", "float32", "--out", out, "--no-progress", "--set", "eval_episodes=2")
    assert code == 0, err
    assert [p["step"] for p in json.loads(stdout.strip().splitlines()[-1])["strategies"]["grpo"]["pro"]] == [0, 1, 2]


def test_compare_json_gives_each_strategys_held_out_points_per_role_with_their_intervals(tmp_path, monkeypatch):
    """Each point of a curve is one evaluation row's reward and 95% interval for that role (None:
    one episode); train rows, and an evaluation without the role's reward, are no points."""
    from orchestrator.cli.compare import write_comparison

    rows = ({"step": 0, "kind": "eval", "eval_reward/pro": 0.5, "eval_ci95/pro": 0.1, "eval_reward/con": -0.5},
            {"step": 1, "kind": "train", "reward/pro": 0.9},
            {"step": 2, "kind": "eval", "eval_reward/pro": 0.25, "eval_ci95/pro": 0.2, "eval_reward/con": None})
    write(tmp_path / "grpo" / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "notes").mkdir()  # no run: not a strategy
    result = write_comparison(tmp_path, ["pro", "con"])
    assert result == {"run_dir": str(tmp_path), "strategies": {"grpo": {
        "pro": [{"step": 0, "reward": 0.5, "ci95": 0.1}, {"step": 2, "reward": 0.25, "ci95": 0.2}],
        "con": [{"step": 0, "reward": -0.5, "ci95": None}]}}}
    assert json.loads((tmp_path / "compare.json").read_text()) == result and (tmp_path / "compare.png").stat().st_size > 0
    # compare.png shades each point's interval, reward ± ci95 (none for one episode's), per role
    from matplotlib.figure import Figure

    bands = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: bands.extend(
        sorted({round(float(y), 6) for y in ax.collections[0].get_paths()[0].vertices[:, 1]}) for ax in fig.axes))
    write_comparison(tmp_path, ["pro", "con"])
    assert bands == [[0.05, 0.4, 0.45, 0.6], [-0.5]]  # pro: 0.5 ± 0.1 at step 0, 0.25 ± 0.2 at step 2


def test_compare_keeps_a_folder_that_holds_no_run(cli, tmp_path):
    out = tmp_path / "cmp"
    (out / "grpo").mkdir(parents=True)
    (out / "grpo" / "notes.txt").write_text("mine")
    code, _, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "shared", "--strategy", "grpo",
                       "--model", "tiny", "--out", out, "--no-progress")
    assert code == 2 and f"{out / 'grpo'} holds files but no training run" in err, err
    assert (out / "grpo" / "notes.txt").read_text() == "mine" and not (out / "shared").exists()  # nothing trained
    # a file where a strategy's run dir goes: a FileExistsError traceback once the model had loaded
    (out / "m-grpo").write_text("mine")
    code, _, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "m-grpo", "--model", "tiny", "--out", out,
                       "--no-progress")
    assert code == 2 and f"{out / 'm-grpo'} is a file, where its run dir goes" in err, err


@pytest.mark.filterwarnings("error")  # runs with no eval rows: matplotlib had warned of an empty legend
def test_a_strategy_named_twice_trains_once(cli, tmp_path, monkeypatch):
    """``--strategy grpo --strategy grpo`` trained grpo, then stopped on its own run ("already holds a
    training run") before compare.json was written."""
    import orchestrator.api

    trained = []

    def train_into(team, where, *args, **kwargs):  # a run dir, as training makes it, and no model
        where.mkdir(parents=True)
        trained.append(where.name)

    monkeypatch.setattr(orchestrator.api, "train_into", train_into)
    code, stdout, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "grpo", "--strategy", "shared",
                            "--strategy", "grpo", "--out", tmp_path / "cmp", "--no-progress")
    assert code == 0, err
    assert trained == ["grpo", "shared"] and (tmp_path / "cmp" / "compare.json").exists()


def test_a_comparison_in_use_is_refused_and_a_killed_runs_lock_file_is_no_obstacle(cli, tmp_path, monkeypatch):
    import os

    import orchestrator.api
    from orchestrator.launch import LOCK_FILE, claimed

    trained = []
    monkeypatch.setattr(orchestrator.api, "train_into", lambda team, where, *args, **kwargs: trained.append(where.name))
    out = tmp_path / "cmp"
    args = ("compare", train_recipe(tmp_path, 1), "--strategy", "grpo", "--out", out, "--no-progress")
    with claimed(out):  # a comparison running into it
        code, _, err = cli(*args)
    assert code == 2 and f"{out} is in use by another rolecast process (pid {os.getpid()})" in err, err
    assert trained == []
    (out / "grpo").mkdir(parents=True)
    (out / "grpo" / LOCK_FILE).write_text("12345\n")  # as a run killed before its config.yaml leaves its dir
    code, _, err = cli(*args)
    assert code == 0 and trained == ["grpo"], err
    (out / "grpo" / "notes.txt").write_text("mine")  # beside the lock file, a file of the user's is one still
    code, _, err = cli(*args)
    assert code == 2 and f"{out / 'grpo'} holds files but no training run" in err and trained == ["grpo"], err


def test_a_comparison_holding_a_run_of_another_recipe_is_refused(cli, tmp_path, monkeypatch):
    """compare.json set every run in OUT side by side: a strategy run of another recipe there (an --out
    reused) stood among this recipe's, its curves empty for roles it never had, without a word."""
    import orchestrator.api

    trained = []
    monkeypatch.setattr(orchestrator.api, "train_into", lambda team, where, *args, **kwargs: trained.append(where.name))
    out = tmp_path / "cmp"
    write(out / "grpo" / "config.yaml", "recipe: {name: guess_number}\nrun: {steps: 1, strategy: grpo}\n")
    write(out / "grpo" / "metrics.jsonl", json.dumps({"step": 0, "kind": "eval", "eval_reward/guesser": 0.3}) + "\n")
    code, _, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "shared", "--out", out, "--no-progress")
    assert code == 2 and f"{out / 'grpo'} is a run of recipe 'guess_number', not 'tiny_debate'" in err, err
    assert trained == [] and not (out / "compare.json").exists()
    (out / "grpo").rename(out / "mine")  # no strategy's folder, whose run no strategy would resume: compare.json's still
    code, _, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "shared", "--out", out, "--no-progress")
    assert code == 2 and f"{out / 'mine'} is a run of recipe 'guess_number', not 'tiny_debate'" in err, err
    assert trained == [] and not (out / "compare.json").exists()


def test_a_strategy_starting_in_a_begun_comparison_trains_as_its_runs_were_started(cli, tmp_path, monkeypatch):
    """A comparison started with --steps 1 --seed 3 --dtype float32 and run again without them (as a
    resume is) trained its new strategies on the recipe's 2 steps, seed 0 and dtype auto, side by
    side in compare.json with the runs of 1 step and seed 3; and one given another seed or training
    option trained unlike them."""
    import orchestrator.api

    trained = {}

    def train_into(team, where, compute, **kwargs):
        trained[where.name] = (compute.model, compute.dtype, kwargs["seed"], kwargs["steps"])

    monkeypatch.setattr(orchestrator.api, "train_into", train_into)
    out, recipe = tmp_path / "cmp", train_recipe(tmp_path, 2)
    for name, steps in (("grpo", 1), ("m-grpo", 1)):
        write(out / name / "config.yaml", f"recipe: {{name: tiny_debate}}\nrun: {{seed: 3, model: tiny, dtype: float32, "
                                          f"steps: {steps}, strategy: {name}}}\n")
        write(out / name / "metrics.jsonl", json.dumps({"step": 0, "kind": "eval", "eval_reward/pro": 0.0}) + "\n")
    code, _, err = cli("compare", recipe, "--strategy", "shared", "--out", out, "--no-progress")
    assert code == 0, err
    assert trained == {"shared": ("tiny", "float32", 3, 1)}
    code, _, err = cli("compare", recipe, "--strategy", "shared", "--steps", "2", "--out", out, "--no-progress")
    assert code == 0 and trained["shared"] == ("tiny", "float32", 3, 2), err  # given: the command's
    # another seed, or another training option, would not be the same comparison
    code, _, err = cli("compare", recipe, "--strategy", "shared", "--seed", "4", "--out", out, "--no-progress")
    assert code == 2 and f"shared would train unlike the comparison's runs: {out / 'grpo'} was started with --seed 3; " \
                         "this command gives 4" in err, err
    write(out / "grpo" / "config.yaml", "recipe: {name: tiny_debate, training: {eval_episodes: 9}}\n"
                                        "run: {seed: 3, model: tiny, dtype: float32, steps: 1, strategy: grpo}\n")
    code, _, err = cli("compare", recipe, "--strategy", "shared", "--out", out, "--no-progress")
    assert code == 2 and f"{out / 'grpo'} was started with training.eval_episodes = 9, this command has 2" in err, err
    write(out / "m-grpo" / "config.yaml", "recipe: {name: tiny_debate}\nrun: {seed: 3, model: tiny, steps: 2}\n")
    write(out / "grpo" / "config.yaml", "recipe: {name: tiny_debate}\nrun: {seed: 3, model: tiny, steps: 1}\n")
    code, _, err = cli("compare", recipe, "--strategy", "shared", "--out", out, "--no-progress")
    assert code == 2 and f"{out}: its runs were started with different --steps (1, 2): give --steps" in err, err


def test_a_recipe_whose_trainer_no_strategy_keeps_is_refused(cli, tmp_path):
    """tictactoe's self-play (its opponent pool) and a population's members were silently dropped:
    every strategy trained one adapter against itself, as plain GRPO."""
    for recipe, trainer in (("tictactoe.yaml", "self-play"), ("rps_population.yaml", "population")):
        code, _, err = cli("compare", ROOT / "recipes" / recipe, "--out", tmp_path / trainer, "--no-progress")
        assert code == 2 and f"trains with {trainer!r}, which every strategy would replace" in err, err
        assert not (tmp_path / trainer).exists()
    # and one that trains nothing at all: its own line, not an AttributeError on its missing block
    code, _, err = cli("compare", ROOT / "recipes/code_review.yaml", "--out", tmp_path / "none", "--no-progress")
    assert code == 2 and "code_review.yaml: the recipe has no `training:` block" in err and "Traceback" not in err, err
    assert not (tmp_path / "none").exists()


def test_a_trainer_option_set_is_refused(cli, tmp_path, monkeypatch):
    """Each strategy replaces the trainer's options: --set trainer_config.scale_std=true was
    accepted and trained every strategy without it."""
    import orchestrator.api

    trained = []
    monkeypatch.setattr(orchestrator.api, "train_into", lambda team, where, *args, **kwargs: trained.append(where.name))
    code, _, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "grpo", "--set", "trainer_config.scale_std=true",
                       "--out", tmp_path / "cmp", "--no-progress")
    assert code == 2 and "--set trainer_config.scale_std: each strategy sets its trainer's options" in err, err
    assert trained == []


def test_freeze_rotate_goes_on_with_the_every_it_was_started_with(cli, tmp_path, monkeypatch):
    """A freeze-rotate run started with --every 2 and continued without it (as the report's
    `rolecast compare RECIPE --out OUT --strategy freeze-rotate` says) was refused: started with
    training.trainer_config.every = 2, this command has 5."""
    import orchestrator.api

    trained = {}
    monkeypatch.setattr(orchestrator.api, "train_into", lambda team, where, *args, **kwargs:
                        trained.update({where.name: team.config.training.trainer_config}))
    out, recipe = tmp_path / "cmp", train_recipe(tmp_path, 1)
    write(out / "freeze-rotate" / "config.yaml", "recipe: {name: tiny_debate, training: {trainer: freeze-rotate, "
                                                 "trainer_config: {every: 2}}}\nrun: {steps: 1, strategy: freeze-rotate}\n")
    code, _, err = cli("compare", recipe, "--strategy", "freeze-rotate", "--strategy", "grpo", "--out", out, "--no-progress")
    assert code == 0, err
    assert trained == {"freeze-rotate": {"every": 2}, "grpo": {}}
    code, _, err = cli("compare", recipe, "--strategy", "freeze-rotate", "--every", "3", "--out", out, "--no-progress")
    assert code == 2 and "was started with training.trainer_config.every = 2, this command has 3" in err, err
    code, _, err = cli("compare", recipe, "--strategy", "freeze-rotate", "--steps", "10", "--out", tmp_path / "new",
                       "--no-progress")
    assert code == 0 and trained["freeze-rotate"] == {"every": 5}, err  # a run starting: the default


def test_freeze_rotate_whose_phases_miss_an_adapter_is_refused(cli, tmp_path, monkeypatch):
    """--steps 2 with --every's default 5: freeze-rotate trained pro alone, and its curves stood in
    compare.json beside strategies that trained both debaters. Its default now fits the steps; an
    --every given that does not is refused."""
    import orchestrator.api

    trained = []
    monkeypatch.setattr(orchestrator.api, "train_into", lambda team, where, *args, **kwargs:
                        trained.append((where.name, team.config.training.trainer_config)))
    recipe, out = train_recipe(tmp_path, 2), tmp_path / "cmp"
    code, _, err = cli("compare", recipe, "--strategy", "grpo", "--strategy", "freeze-rotate", "--every", "5",
                       "--out", out, "--no-progress")
    assert code == 2 and "--every 5 over 2 steps: freeze-rotate would never train con" in err, err
    assert trained == []
    code, _, err = cli("compare", recipe, "--strategy", "freeze-rotate", "--out", out, "--no-progress")
    assert code == 0 and trained == [("freeze-rotate", {"every": 1})], err  # pro, then con
    code, _, err = cli("compare", recipe, "--strategy", "freeze-rotate", "--steps", "1", "--out", tmp_path / "one",
                       "--no-progress")
    assert code == 2 and "--every 1 over 1 steps: freeze-rotate would never train con" in err, err
    # --every without freeze-rotate among the strategies: no run would have phases, and the flag was ignored unsaid
    code, _, err = cli("compare", recipe, "--strategy", "grpo", "--every", "1", "--out", tmp_path / "none", "--no-progress")
    assert code == 2 and "--every is freeze-rotate's phase length: only with --strategy freeze-rotate" in err, err
    assert not (tmp_path / "none").exists()
    for every, steps in (("1", "2"), ("2", "3")):
        code, _, err = cli("compare", recipe, "--strategy", "freeze-rotate", "--every", every, "--steps", steps,
                           "--out", tmp_path / f"cmp-{every}", "--no-progress")
        assert code == 0, err


def test_an_out_that_is_a_run_dir_is_refused(cli, tmp_path, monkeypatch):
    """--out naming a training run's own dir: the strategies' run dirs, compare.json and compare.png
    went in among its checkpoints and rollouts."""
    import orchestrator.api

    trained = []
    monkeypatch.setattr(orchestrator.api, "train_into", lambda team, where, *args, **kwargs: trained.append(where.name))
    out = tmp_path / "train-run"
    write(out / "config.yaml", "recipe: {name: tiny_debate}\nrun: {steps: 1}\n")
    code, _, err = cli("compare", train_recipe(tmp_path, 1), "--strategy", "grpo", "--out", out, "--no-progress")
    assert code == 2 and f"--out {out} already holds a run" in err, err
    assert trained == [] and sorted(p.name for p in out.iterdir()) == ["config.yaml"]


def test_steps_below_a_strategys_checkpoint_are_refused_before_anything_trains(cli, tmp_path, monkeypatch):
    """--steps 1 with grpo's run at step 2: m-grpo, named first, trained its step, then grpo's resume
    stopped ("is at step 2, past --steps 1") once its model had loaded, and compare.json was not written."""
    import orchestrator.api

    trained = []
    monkeypatch.setattr(orchestrator.api, "train_into", lambda team, where, *args, **kwargs: trained.append(where.name))
    out = tmp_path / "cmp"
    write(out / "grpo" / "config.yaml", "recipe: {name: tiny_debate}\nrun: {steps: 2, strategy: grpo}\n")
    write(out / "grpo" / "checkpoints" / "step-000002" / "trainer.json", json.dumps({"step": 2, "trainer": {}}))
    code, _, err = cli("compare", train_recipe(tmp_path, 2), "--strategy", "m-grpo", "--strategy", "grpo", "--steps", "1",
                       "--out", out, "--no-progress")
    assert code == 2 and f"--resume: {out / 'grpo'} is at step 2, past --steps 1" in err, err
    assert trained == []
