"""`--set KEY=VALUE` on train and compare: budgets and plugin options, checked like the recipe."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.flags import parse_sets
from orchestrator.errors import RolecastError
from orchestrator.team import load_team, with_training_options

ROOT = Path(__file__).resolve().parents[2]


def apply_sets(team, flags):
    return with_training_options(team, parse_sets(flags))


@pytest.fixture(scope="module")
def team():
    return load_team(ROOT / "recipes/rps_population.yaml")


def test_a_number_in_e_notation_is_a_number_in_a_flag_and_in_a_file(team, tmp_path):
    """PyYAML reads YAML 1.1, where 1e-4 (no dot) is text: a plugin option kept and recorded '1e-4'
    as text, which only options typed as numbers turned back into one."""
    from orchestrator.yamlfile import load_yaml

    t = apply_sets(team, ["loss_config.kl_coef=1e-2", "trainer_config.elo_k=2E1"])
    assert t.config.training.loss_config["kl_coef"] == 0.01 and t.config.training.trainer_config["elo_k"] == 20.0
    (tmp_path / "r.yaml").write_text("lr: 1e-4\nscaled: [+5.0e-1, 3e2]\nname: 1e-4 text\nversion: 1e\n")
    assert load_yaml(tmp_path / "r.yaml").data == {"lr": 1e-4, "scaled": [0.5, 300.0], "name": "1e-4 text", "version": "1e"}


def test_budget_and_plugin_options_apply(team):
    t = apply_sets(team, ["group_size=3", "adam.learning_rate=1e-3", "trainer_config.members=2",
                          "trainer_config.matchmaking=elo", "loss_config.kl_coef=0.1"])
    training = t.config.training
    assert training.group_size == 3 and training.adam.learning_rate == 1e-3
    assert training.trainer_config["members"] == 2 and training.trainer_config["matchmaking"] == "elo"
    assert training.trainer_config["snapshot_every"] == 5  # the recipe's other options stay
    assert training.loss_config["kl_coef"] == 0.1
    assert team.config.training.group_size == 8  # the loaded team is not changed
    t = apply_sets(team, ["role_loss_config.alice.entropy_coef=0.1", "role_loss_config.alice.kl_coef=0.2"])
    assert t.config.training.role_loss_config == {"alice": {"entropy_coef": 0.1, "kl_coef": 0.2}}
    assert apply_sets(team, ["repetition_penalty.alice=0.5"]).config.training.repetition_penalty == {"alice": 0.5}


@pytest.mark.parametrize("flag, message", [
    ("trainer_config.members=1", "--set: trainer_config: members: a population needs two or more distinct members"),
    ("trainer_config.snapshot_evry=5", "--set: trainer_config.snapshot_evry: unknown key (allowed: "),
    ("trainer_config.matchmaking=nearest", "--set: trainer_config.matchmaking: Input should be 'uniform', 'elo' or "
                                           "'pfsp' (got 'nearest')"),
    ("group_size=0", "--set: group_size: Input should be greater than or equal to 1 (got 0)"),
    ("trainer_config=1", "--set trainer_config: not a settable option; use one of steps, group_size"),
    ("trainer=grpo", "--set trainer: not a settable option"),
    ("group_size", "--set 'group_size': expected KEY=VALUE"),
    ("=4", "--set '=4': expected KEY=VALUE"),
    ("group_size=[", "--set 'group_size=[': VALUE is not YAML"),
    ("group_size=0x_", "--set 'group_size=0x_': VALUE is not YAML"),  # a number YAML cannot make: a ValueError traceback
    ("adam.nope.x=1", "--set adam.nope.x: not an option"),
    ("role_loss_config.alice=1", "role_loss_config.ROLE.X"),
    ("trainer_config.players=[alice, carol]", "--set: trainer_config: population: the players ['alice', 'carol'] must be "
                                              "trainable roles"),
    ("role_loss_config.carol.entropy_coef=0.1", "--set: role_loss_config.carol: not a role that learns"),
    ("role_loss_config.alice.entropy_cof=0.1", "--set: role_loss_config.alice.entropy_cof: unknown key"),
    ("repetition_penalty.carol=0.5", "--set: repetition_penalty.carol: not a role that learns"),
    ("repetition_penalty.alice=-1", "--set: repetition_penalty.alice: must be 0 or more, got -1.0"),
    ("lora.alpha=1e999", "--set: lora.alpha: Input should be a finite number (got inf)"),
    ("loss_config.kl_coef=.inf", "--set: loss_config.kl_coef: Input should be a finite number (got inf)"),
    ("role_loss_config.bob.temperature=2", "--set: role_loss_config.bob.temperature: not an option: each role's "
                                           "policy.sampling.temperature is used"),
])
def test_bad_values_are_one_line_errors(team, flag, message):
    with pytest.raises(RolecastError) as info:
        apply_sets(team, [flag])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_no_options_is_the_team_itself_even_without_a_training_block(team):
    """``rolecast.load_team(team)`` passes no sets for every team: one without `training:` must load, not be refused."""
    plain = load_team(ROOT / "recipes/guess_number.yaml")
    plain = plain.__class__(**{**plain.__dict__, "config": plain.config.model_copy(update={"training": None})})
    assert with_training_options(plain, {}) is plain and with_training_options(team, {}) is team
