"""trainer_config, reward_config and loss_config are checked against the plugins' Config models:
a misspelt or out-of-range option is one ``FILE:LINE: KEY: problem`` line and exit code 2."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import PluginConfig
from orchestrator.errors import RolecastError
from orchestrator.registry import discover
from orchestrator.team import load_team
from support import ERROR_LINE, plugin

RECIPES = Path(__file__).resolve().parent.parent / "recipes"

# (id, recipe, text in it, replacement, line, key, words the problem must contain)
CASES = [
    ("trainer-typo", "rps.yaml", "snapshot_every: 5", "snapshot_evry: 5",
     33, "training.trainer_config.snapshot_evry", "unknown key (allowed: elo_k, latest_prob, players, pool_size"),
    ("trainer-bad-choice", "rps.yaml", "pool_size: 5}", "pool_size: 5, sampling: winrate}",
     33, "training.trainer_config.sampling", "'uniform' or 'win_rate'"),
    ("trainer-out-of-range", "rps.yaml", "pool_size: 5}", "pool_size: 5, latest_prob: 1.5}",
     33, "training.trainer_config.latest_prob", "less than or equal to 1"),
    ("trainer-option-of-another-trainer", "debate.yaml", "trainer: grpo", "trainer: grpo\n  trainer_config: {baseline: team}",
     34, "training.trainer_config.baseline", "unknown key (allowed: scale_std)"),
    ("reward-typo", "guess_number.yaml", "{alpha: 0.6}", "{alhpa: 0.6}",
     36, "training.reward_config.alhpa", "unknown key (allowed: alpha)"),
    ("reward-bad-value", "guess_number.yaml", "{alpha: 0.6}", "{alpha: 2}",
     36, "training.reward_config.alpha", "less than or equal to 1 (got 2)"),
    ("reward-without-options", "debate.yaml", "reward: env", "reward: env\n  reward_config: {alpha: 0.5}",
     35, "training.reward_config.alpha", "unknown key"),
    ("judge-reward-typo", "debate.yaml", "reward: env", "reward: judge\n  reward_config:\n    judge: judge\n    loose: -1",
     37, "training.reward_config.loose", "unknown key (allowed: field, judge, lose, stances, win)"),
    ("loss-typo", "debate.yaml", "clip_low_threshold: 0.8", "clip_low: 0.8",
     39, "training.loss_config.clip_low", "unknown key (allowed: aggregation, clip_high_threshold, clip_low_threshold"),
    ("loss-option-of-another-loss", "debate.yaml", "loss: ppo", "loss: importance_sampling",
     39, "training.loss_config.clip_low_threshold", "unknown key (allowed: aggregation, entropy_coef, kl_coef)"),
    ("loss-bad-aggregation", "debate.yaml", "aggregation: token-mean", "aggregation: mean",
     39, "training.loss_config.aggregation", "'token-sum', 'token-mean' or 'sequence-mean'"),
    ("loss-temperature", "debate.yaml", "aggregation: token-mean}", "aggregation: token-mean, temperature: 0.7}",
     39, "training.loss_config.temperature", "policy.sampling.temperature"),
    ("role-loss-typo", "debate.yaml", "aggregation: token-mean}\n", "aggregation: token-mean}\n  role_loss_config:\n    pro: {entropy_cof: 0.1}\n",
     41, "training.role_loss_config.pro.entropy_cof", "unknown key (allowed: aggregation, clip_high_threshold"),
    ("role-loss-not-a-learner", "debate.yaml", "aggregation: token-mean}\n", "aggregation: token-mean}\n  role_loss_config:\n    judge: {entropy_coef: 0.1}\n",
     41, "training.role_loss_config.judge", "not a role that learns (those that do: pro, con)"),
    ("role-loss-temperature", "debate.yaml", "aggregation: token-mean}\n", "aggregation: token-mean}\n  role_loss_config:\n    con: {temperature: 2}\n",
     41, "training.role_loss_config.con.temperature", "policy.sampling.temperature"),
    ("unknown-trainer", "rps.yaml", "trainer: self-play", "trainer: self_play",
     32, "training.trainer", "unknown trainer plugin 'self_play'"),
    # options that fit the trainer's Config but not the team: caught at load, not after the model loads
    ("self-play-on-a-one-player-game", "guess_number.yaml", "trainer: grpo", "trainer: self-play",
     33, "training.trainer_config", "self-play needs two or more trainable players sharing one adapter; got ['guesser']"),
    ("self-play-on-two-adapters", "rps.yaml", "name: bob\n    policy: {adapter: player}", "name: bob\n    policy: {adapter: other}",
     33, "training.trainer_config", "sharing one adapter"),
    ("self-play-one-player-twice", "rps.yaml", "{players: [alice, bob], snapshot", "{players: [alice, bob, alice], snapshot",
     33, "training.trainer_config", "players must be different roles"),
    ("population-one-player-twice", "rps_population.yaml", "{players: [alice, bob], members", "{players: [bob, bob], members",
     39, "training.trainer_config", "players must be different roles"),
    ("m-grpo-team-reward-of-a-role-that-does-not-learn", "debate.yaml", "trainer: grpo",
     "trainer: m-grpo\n  trainer_config: {team_reward_role: judge}",
     34, "training.trainer_config", "team_reward_role 'judge' is not a trainable role; trainable: ['pro', 'con']"),
    ("m-grpo-team-reward-role-beside-another-baseline", "debate.yaml", "trainer: grpo",
     "trainer: m-grpo\n  trainer_config: {baseline: global, team_reward_role: pro}",
     34, "training.trainer_config", "team_reward_role: only baseline team reads the team's reward, not global"),
    ("zero-sum-unknown-player", "debate.yaml", "reward: env", "reward: zero-sum\n  reward_config: {players: [pro, conn]}",
     35, "training.reward_config", "players: 'conn' not a role of the team (pro, con, judge)"),
    ("judge-reward-unknown-judge", "debate.yaml", "reward: env", "reward: judge\n  reward_config: {judge: referee}",
     35, "training.reward_config", "judge: 'referee' not a role of the team (pro, con, judge)"),
    ("judge-reward-unknown-stance-role", "debate.yaml", "reward: env",
     "reward: judge\n  reward_config: {stances: {pro: for, against: against}}",
     35, "training.reward_config", "stances: 'against' not a role of the team (pro, con, judge)"),
    # a verdict field the judge's schema lacks: no verdict named a winner, every reward 0, silently
    ("judge-reward-unknown-field", "debate.yaml", "reward: env", "reward: judge\n  reward_config: {field: winer}",
     35, "training.reward_config", "reward plugin 'judge' reads field(s) winer of the messages of role 'judge', "
     "which its output_schema does not declare (properties: winner, reason)"),
    ("judge-reward-judge-without-verdicts", "debate.yaml", "reward: env", "reward: judge\n  reward_config: {judge: pro}",
     35, "training.reward_config", "reads field(s) winner of the messages of role 'pro'"),
    # a verdict "for" had crowned con and counted pro, of the same stance, a loser
    ("judge-reward-shared-stance", "debate.yaml", "reward: env", "reward: judge\n  reward_config: {stances: {pro: for, con: For}}",
     35, "training.reward_config", "stances: 'for' is more than one role's"),
    ("freeze-rotate-unknown-adapter", "prisoners_dilemma.yaml", "{every: 5}", "{every: 5, schedule: [nobody]}",
     35, "training.trainer_config", "schedule names unknown adapter(s) ['nobody']"),
    ("nothing-learns", "guess_number.yaml", "name: guesser\n", "name: guesser\n    policy: {trainable: false}\n",
     34, "training", "no role learns"),
]


def recipe(tmp_path: Path, name: str, old: str = "", new: str = "") -> Path:
    text = (RECIPES / name).read_text()
    assert old in text, f"{old!r} not in {name}"
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_plugin_option_is_one_line_exit_2(case, tmp_path, cli):
    _, name, old, new, line, key, words = case
    path = recipe(tmp_path, name, old, new)
    code, _, err = cli("validate", path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    m = ERROR_LINE.match(lines[0])
    assert m and m["file"] == str(path) and int(m["line"]) == line and m["key"] == key, lines[0]
    assert words in m["problem"], lines[0]


def test_options_reach_the_plugins_as_their_models(tmp_path):
    team = load_team(recipe(tmp_path, "rps.yaml"))
    assert team.config.training.trainer_config == {"players": ["alice", "bob"], "snapshot_every": 5, "pool_size": 5}
    from orchestrator.training.loop import TrainingRun, TrainOptions

    class Service:
        def create_lora_training_client(self, adapter, lora):
            return None

    run = TrainingRun(team, TrainOptions(out_dir=tmp_path / "run", model="tiny"), engine=None, service=Service())
    assert run.trainer.config.snapshot_every == 5 and run.trainer.config.latest_prob == 0.8  # given, and a default
    assert run.trainer.players == ["alice", "bob"]
    assert type(run.reward_config) is PluginConfig  # `env` takes no options


def test_options_changed_after_load_that_do_not_fit_the_team_are_one_line_at_train_time(tmp_path):
    import dataclasses

    from orchestrator.training.loop import TrainingRun, TrainOptions

    team = load_team(recipe(tmp_path, "rps.yaml"))
    training = team.config.training.model_copy(update={"trainer_config": {"players": ["alice", "carol"]}})
    team = dataclasses.replace(team, config=team.config.model_copy(update={"training": training}))
    with pytest.raises(RolecastError) as caught:
        TrainingRun(team, TrainOptions(out_dir=tmp_path / "run", model="tiny"), engine=None, service=None)
    assert str(caught.value).startswith(f"{team.path}: training.trainer_config: self-play needs two or more")


def test_registry_refuses_trainers_and_rewards_that_break_the_contract():
    class Loose(PluginConfig):
        model_config = {"extra": "ignore"}

    def loose_reward(episode, roles, config):
        return {}

    loose_reward.Config = Loose

    class DuckTrainer:  # the loop's hooks are not all there
        def advantages(self, rewards):
            return rewards

    registry = discover()
    registry.add_module(plugin(register_trainers=lambda register: register("duck", DuckTrainer),
                               register_rewards=lambda register: register("loose", loose_reward)), "shaky", "test")
    errors = sorted(f.error for f in registry.failures if f.plugin == "shaky")
    assert "register_rewards: TypeError" in errors[0] and "forbids unknown keys" in errors[0]
    assert "register_trainers: TypeError" in errors[1] and "not a subclass of" in errors[1]
    assert "duck" not in registry.names("trainers") and "loose" not in registry.names("rewards")


def test_a_plugin_that_raises_while_the_team_loads_is_one_line_naming_it(tmp_path):
    """A trainer's __init__, a Config's check_roles or an env's Config raising something other than
    the ValueError that says the team does not fit was a traceback at `rolecast validate`."""
    from pydantic import field_validator, model_validator

    from orchestrator.envs.guess_number import GuessNumberConfig, GuessNumberEnv
    from orchestrator.training.trainer import Trainer

    class Broken(Trainer):
        def __init__(self, context):
            raise RuntimeError("boom")

        def advantages(self, rewards):
            return rewards

    class Picky(PluginConfig):
        def check_roles(self, roles):
            raise KeyError(roles[0])

    def picky(episode, roles, config):
        return {}

    picky.Config = Picky

    class OddConfig(GuessNumberConfig):
        @model_validator(mode="after")
        def _odd(self):
            raise TypeError("odd")

    class OddEnv(GuessNumberEnv):
        Config = OddConfig

    class Blind(GuessNumberEnv):
        @classmethod
        def observes(cls, config, role):
            return cls.observation_keys - role  # a set less a string: a TypeError

    class TouchyTask(GuessNumberEnv.Task):
        @field_validator("secret")
        @classmethod
        def _secret(cls, value):
            raise KeyError("secret")

    class Touchy(GuessNumberEnv):
        Task = TouchyTask

    class Listed(GuessNumberEnv):
        observation_keys = ["history"]  # a list, not the frozenset it declares

    def envs(register):
        register("odd", OddEnv)
        register("blind", Blind)
        register("listed", Listed)
        register("touchy", Touchy)

    registry = discover()
    registry.add_module(plugin(register_trainers=lambda register: register("broken", Broken),
                               register_rewards=lambda register: register("picky", picky),
                               register_envs=envs), "mine", "test")
    picky_reward = [("reward: hybrid", "reward: picky"), ("reward_config: {alpha: 0.6}", "reward_config: {}")]
    for edits, line, key, problem in [
            ([("trainer: grpo", "trainer: broken")], 34, "training.trainer", "trainer plugin 'broken': __init__ raised RuntimeError: boom"),
            (picky_reward, 35, "training.reward", "reward plugin 'picky': check_roles raised KeyError: 'guesser'"),
            ([("type: guess_number", "type: odd")], 13, "protocol.type", "env plugin 'odd': its Config raised TypeError: odd"),
            ([("type: guess_number", "type: blind")], 13, "protocol.type", "env plugin 'blind': observes or reads raised "
                                                                           "TypeError: unsupported operand type(s) for -: 'frozenset' and 'str'"),
            ([("type: guess_number", "type: listed")], 13, "protocol.type", "env plugin 'listed': observes or reads raised "
                                                                            "TypeError: unsupported operand type(s) for |: 'frozenset' and 'list'"),
            ([("type: guess_number", "type: touchy")], 31, "tasks[0]", "Touchy.Task raised KeyError: 'secret'")]:
        path = recipe(tmp_path, "guess_number.yaml")
        for old, new in edits:
            path.write_text(path.read_text().replace(old, new))
        with pytest.raises(RolecastError) as caught:
            load_team(path, registry)
        assert str(caught.value) == f"{path}:{line}: {key}: {problem}"


def test_a_trainer_or_reward_config_whose_validator_raises_is_one_line_naming_it(tmp_path):
    """A Config validator raising other than ValueError (pydantic passes such errors through) was a
    traceback at `rolecast validate`, where an env's Config raising it was already one line."""
    from pydantic import field_validator

    from orchestrator.training.trainer import Trainer

    class Touchy(PluginConfig):
        gain: float = 1.0

        @field_validator("gain")
        @classmethod
        def _gain(cls, value):
            raise KeyError("gain")

    class Scaled(Trainer):
        Config = Touchy

        def advantages(self, rewards):
            return rewards

    def touchy(episode, roles, config):
        return {}

    touchy.Config = Touchy
    registry = discover()
    registry.add_module(plugin(register_trainers=lambda register: register("scaled", Scaled),
                               register_rewards=lambda register: register("touchy", touchy)), "mine", "test")
    for edits, line, key, name in [
            ([("trainer: grpo", "trainer: scaled\n  trainer_config: {gain: 2}")], 34, "trainer", "scaled"),
            ([("reward: hybrid", "reward: touchy"), ("{alpha: 0.6}", "{gain: 2}")], 35, "reward", "touchy")]:
        path = recipe(tmp_path, "guess_number.yaml")
        for old, new in edits:
            path.write_text(path.read_text().replace(old, new))
        with pytest.raises(RolecastError) as caught:
            load_team(path, registry)
        assert str(caught.value) == f"{path}:{line}: training.{key}: {key} plugin {name!r}: its Config raised KeyError: 'gain'"


def test_a_boolean_in_a_list_of_numbers_is_refused_at_its_index_and_a_field_that_takes_booleans_keeps_them():
    """A plugin's ``weights: list[float]`` read ``[0.5, true]`` as ``[0.5, 1.0]``; a field that takes
    a boolean beside a number (``cap: float | bool``) must keep ``true``, not refuse it as a number."""
    from pydantic import ValidationError

    class Weighted(PluginConfig):
        weights: list[float] = []
        cap: float | bool = False

    with pytest.raises(ValidationError) as info:
        Weighted.model_validate({"weights": [0.5, True]})
    (error,) = info.value.errors()
    assert error["loc"] == ("weights", 1) and error["msg"] == "must be a number, not a boolean"
    assert Weighted.model_validate({"cap": True}).cap is True
