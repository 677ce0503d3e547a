"""Advantages and schedules of the trainer plugins, and the reward plugins, on hand-made batches."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.registry import config_model, default_registry
from orchestrator.training.trainer import TrainerContext, build_trainer
from orchestrator.transcript import Turn
from support import make_episode

REG = default_registry()


def trainer(name: str, **config):
    cls = REG.get("trainers", name)
    return cls(TrainerContext(adapters={"pro": "pro", "con": "con"}, config=cls.Config(**config)))


# two groups (tasks) of three episodes each
REWARDS = [
    [{"pro": 1.0, "con": -0.5}, {"pro": -0.5, "con": 1.0}, {"pro": 1.0, "con": -0.5}],
    [{"pro": 0.0, "con": 0.0}, {"pro": 0.0, "con": 0.0}, {"pro": 0.0, "con": 0.0}],
]


def test_grpo_mean_centres_per_role_within_each_group():
    adv = trainer("grpo").advantages(REWARDS)
    assert [e["pro"] for e in adv[0]] == pytest.approx([0.5, -1.0, 0.5])
    assert [e["con"] for e in adv[0]] == pytest.approx([-0.5, 1.0, -0.5])
    assert adv[1] == [{"pro": 0.0, "con": 0.0}] * 3  # no signal in a group of equal rewards


@pytest.mark.parametrize("name", ["grpo", "m-grpo", "self-play"])
def test_an_episode_that_failed_is_in_no_baseline(name):
    """Its rewards are placeholders (an error, a timeout): the group's others are centred without it."""
    t = trainer(name) if name != "self-play" else REG.get("trainers", name)(TrainerContext(adapters={"pro": "p", "con": "p"}))
    with_failed = [REWARDS[0] + [{"pro": -9.0, "con": 9.0}], REWARDS[1]]
    adv = t.step_advantages(with_failed, [[True, True, True, False], [True] * 3])
    assert adv[0][:3] == t.advantages(REWARDS)[0] and adv[0][3] == {"pro": 0.0, "con": 0.0}
    assert adv[1] == t.advantages(REWARDS)[1]


@pytest.mark.parametrize("advantages", [lambda rewards: [g[:-1] for g in rewards],  # one short: was StopIteration
                                        lambda rewards: [g + g[:1] for g in rewards],  # one more: silently dropped
                                        lambda rewards: rewards + rewards[:1]])  # one group more: silently dropped
def test_advantages_of_another_shape_than_the_episodes_given_are_refused(advantages):
    """A plugin's advantages that miss or add an episode or a group cannot be matched to the episodes."""
    class Misshapen(type(trainer("grpo"))):
        def advantages(self, rewards):
            return advantages(rewards)

    t = Misshapen(TrainerContext(adapters={"pro": "pro", "con": "con"}))
    with pytest.raises(ValueError, match=r"episodes per group for the \[3, 2\] finished ones it was given"):
        t.step_advantages(REWARDS, [[True] * 3, [True, True, False]])


def test_advantages_in_one_list_of_all_episodes_are_refused_as_such():
    """A flat list of the step's episodes was read as groups, each a row's roles: "gave [2, 2, 2, 2, 2]
    episodes per group for the [3, 2] finished ones", which a plugin's author could not place."""
    class Flat(type(trainer("grpo"))):
        def advantages(self, rewards):
            return [episode for group in super().advantages(rewards) for episode in group]

    t = Flat(TrainerContext(adapters={"pro": "pro", "con": "con"}))
    with pytest.raises(ValueError, match=r"gave a \{role: advantage\} mapping where a group's list of them goes"):
        t.step_advantages(REWARDS, [[True] * 3, [True, True, False]])


@pytest.mark.parametrize("config", [{}, {"baseline": "global"}, {"baseline": "global", "scale_std": True},
                                    {"baseline": "per_role"}])
def test_a_group_whose_every_episode_failed_gets_zeros_and_the_others_train(config):
    """One task that always errors leaves an empty group, not a ZeroDivisionError for the step."""
    adv = trainer("m-grpo", **config).step_advantages([REWARDS[0], REWARDS[1]], [[True] * 3, [False] * 3])
    assert adv[0] == trainer("m-grpo", **config).advantages([REWARDS[0]])[0]
    assert adv[1] == [{"pro": 0.0, "con": 0.0}] * 3


def test_grpo_std_scaling():
    adv = trainer("grpo", scale_std=True).advantages(REWARDS)
    std = (2 * 0.5**2 + 1.0**2) ** 0.5 / 3**0.5  # population std of [1, -0.5, 1]
    assert [e["pro"] for e in adv[0]] == pytest.approx([0.5 / std, -1.0 / std, 0.5 / std], rel=1e-5)


def test_mgrpo_gives_every_role_the_team_advantage():
    rewards = [[{"pro": 1.0, "con": 0.0}, {"pro": 0.0, "con": 0.0}, {"pro": 1.0, "con": 1.0}]]
    adv = trainer("m-grpo").advantages(rewards)
    team = [0.5, 0.0, 1.0]  # mean over roles per episode
    expected = [t - 0.5 for t in team]
    assert [e["pro"] for e in adv[0]] == pytest.approx(expected)
    assert [e["con"] for e in adv[0]] == pytest.approx(expected)
    per_role = trainer("m-grpo", baseline="per_role").advantages(rewards)
    assert [e["pro"] for e in per_role[0]] == pytest.approx([1 / 3, -2 / 3, 1 / 3])
    assert [e["con"] for e in per_role[0]] == pytest.approx([-1 / 3, -1 / 3, 2 / 3])
    judged = trainer("m-grpo", team_reward_role="con").advantages(rewards)  # con's reward is the team's
    assert [e["pro"] for e in judged[0]] == [e["con"] for e in judged[0]] == pytest.approx([-1 / 3, -1 / 3, 2 / 3])
    scaled = trainer("m-grpo", scale_std=True).advantages(rewards)  # by the std of the team rewards, 0.5 / sqrt(1.5)
    assert [e["pro"] for e in scaled[0]] == [e["con"] for e in scaled[0]] == pytest.approx(
        [0.0, -(1.5 ** 0.5), 1.5 ** 0.5], rel=1e-5)


def test_mgrpo_global_pools_every_role_and_per_role_scales_each_role_by_its_own_std():
    # con's rewards sit ten times lower than pro's: one pooled baseline leaves con's advantages all
    # negative and tiny; per role, with std scaling (Dr. MAS), both roles get unit-scale advantages.
    rewards = [[{"pro": 1.0, "con": 0.1}, {"pro": 0.0, "con": 0.0}]]
    pooled = trainer("m-grpo", baseline="global").advantages(rewards)
    assert [e["con"] for e in pooled[0]] == pytest.approx([0.1 - 0.275, -0.275])
    assert [e["pro"] for e in pooled[0]] == pytest.approx([1.0 - 0.275, -0.275])
    agent_wise = trainer("m-grpo", baseline="per_role", scale_std=True).advantages(rewards)
    for role in ("pro", "con"):
        assert [e[role] for e in agent_wise[0]] == pytest.approx([1.0, -1.0], rel=1e-4)
    scaled = trainer("m-grpo", baseline="global", scale_std=True).advantages(rewards)
    std = ((0.725**2 + 0.175**2 + 2 * 0.275**2) / 4) ** 0.5  # the population std of the four pooled rewards
    assert [e["con"] for e in scaled[0]] == pytest.approx([-0.175 / std, -0.275 / std], rel=1e-4)


def test_build_trainer_and_the_default_hooks_name_a_shared_adapter_once_in_team_order():
    """Two roles on one adapter learn it once: listed per role, it was two learners and two phases."""
    adapters = {"b": "shared", "c": "solo", "a": "shared"}
    grpo = build_trainer(REG.get("trainers", "grpo"), adapters, {"scale_std": True}, episodes_per_step=8)
    assert grpo.learners() == grpo.adapters_to_train(1) == ["shared", "solo"]  # by default every learner, every step
    assert grpo.config.scale_std and grpo.context.episodes_per_step == 8  # the recipe's options and the step's size
    rotate = build_trainer(REG.get("trainers", "freeze-rotate"), adapters, {"every": 1})
    assert [rotate.adapters_to_train(s) for s in range(1, 4)] == [["shared"], ["solo"], ["shared"]]


def test_mgrpo_means_every_roles_reward_and_a_group_of_equal_or_lone_rewards_gives_zeros():
    three = REG.get("trainers", "m-grpo")(TrainerContext(adapters={"a": "a", "b": "b", "c": "c"}))
    adv = three.advantages([[{"a": 3.0, "b": 0.0, "c": 0.0}, {"a": 0.0, "b": 0.0, "c": 0.0}]])
    assert [e["b"] for e in adv[0]] == pytest.approx([0.5, -0.5])  # team rewards 1 and 0: the mean over three roles
    # the pooled std of equal rewards is 0: no ZeroDivisionError, no signal
    assert trainer("m-grpo", baseline="global", scale_std=True).advantages([REWARDS[1]]) == [REWARDS[1]]
    alone = REG.get("trainers", "m-grpo")(TrainerContext(adapters={"a": "a"}, config=REG.get("trainers", "m-grpo").Config(
        baseline="global")))
    assert alone.advantages([[{"a": 1.0}]]) == [[{"a": 0.0}]]  # one reward is its own baseline


def test_freeze_rotate_schedule():
    t = trainer("freeze-rotate", every=3)  # the loop's steps start at 1: the first phase is 3 steps too
    assert [t.adapters_to_train(s)[0] for s in range(1, 9)] == ["pro"] * 3 + ["con"] * 3 + ["pro"] * 2
    t = trainer("freeze-rotate", every=1, schedule=["con", "con", "pro"])
    assert [t.adapters_to_train(s)[0] for s in range(1, 5)] == ["con", "con", "pro", "con"]
    with pytest.raises(ValueError, match="unknown adapter"):
        trainer("freeze-rotate", schedule=["judge"])
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        trainer("freeze-rotate", every=0)


def episode(rewards, outcome=None, judge_says=None):
    turns = [] if judge_says is None else [("judge", [], {"winner": judge_says})]
    return make_episode(*turns, rewards=rewards, outcome=outcome)


def reward(name, ep, roles, **config):
    fn = REG.get("rewards", name)
    return fn(ep, roles, config_model(fn)(**config))


def test_reward_plugins_by_hand():
    ep = episode({"planner": 0.0, "coder": -1.0}, {"outcome": 0.5, "process": {"planner": 1.0, "coder": 0.25}})
    roles = ["planner", "coder"]
    assert reward("env", ep, roles) == {"planner": 0.0, "coder": -1.0}
    assert reward("outcome", ep, roles) == {"planner": 0.5, "coder": 0.5}
    assert reward("hybrid", ep, roles) == pytest.approx({"planner": 0.6 * 0.5 + 0.4 * 1.0, "coder": 0.6 * 0.5 + 0.4 * 0.25})
    assert reward("hybrid", ep, roles, alpha=1.0) == {"planner": 0.5, "coder": 0.5}
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        reward("hybrid", ep, roles, alpha=2)
    duel = episode({"pro": 1.0, "con": -0.5})
    assert reward("zero-sum", duel, ["pro", "con"]) == {"pro": 0.75, "con": -0.75}
    judged = episode({}, judge_says="against")
    assert reward("judge", judged, ["pro", "con", "judge"], stances={"pro": "for", "con": "against"}) == {
        "pro": -0.5, "con": 1.0, "judge": 0.0}
    assert reward("judge", episode({}, judge_says="nobody"), ["pro", "con"]) == {"pro": 0.0, "con": 0.0}
    # verdicts are compared without case: a role named with capitals wins when named as it is spelt
    assert reward("judge", episode({}, judge_says="Alice"), ["Alice", "Bob", "judge"]) == {
        "Alice": 1.0, "Bob": -0.5, "judge": 0.0}
    assert reward("outcome", episode({"a": 1.0, "b": 0.0}), ["a", "b"]) == {"a": 0.5, "b": 0.5}
    # a label the env showed the judge names its side, before a role called by that letter
    lettered = make_episode(("judge", [], {"winner": "A"}), outcome={"labels": {"A": "b", "B": "a"}})
    assert reward("judge", lettered, ["a", "b", "judge"]) == {"a": -0.5, "b": 1.0, "judge": 0.0}


def test_rewards_that_read_no_env_reward_keep_each_roles_invalid_penalty():
    """A coder's turn still invalid after its retries (penalty -1): under the env's outcome or a
    judge's verdict it had cost the coder nothing, its role's invalid_penalty silently void."""
    ep = episode({"planner": 0.0, "coder": -1.0}, {"outcome": 0.5, "process": {"planner": 1.0, "coder": 0.25}})
    ep.turns = [Turn(turn=0, role="coder", message_id="e:0", content=None, valid=False, retries=2, penalty=-1.0)]
    roles = ["planner", "coder"]
    assert reward("outcome", ep, roles) == {"planner": 0.5, "coder": -0.5}
    assert reward("hybrid", ep, roles) == pytest.approx({"planner": 0.6 * 0.5 + 0.4 * 1.0, "coder": 0.6 * 0.5 + 0.4 * 0.25 - 1.0})
    # without the env's outcome R is the mean of the roles' rewards less their penalties: the coder's
    # had been shared with the planner, and under hybrid scaled by alpha (at alpha 0, gone)
    del ep.outcome["outcome"]
    assert reward("outcome", ep, roles) == {"planner": 0.0, "coder": -1.0}
    assert reward("hybrid", ep, roles, alpha=0.0) == {"planner": 1.0, "coder": 0.25 - 1.0}
    judged = episode({}, judge_says="against")
    judged.turns.append(Turn(turn=1, role="pro", message_id="e:1", content=None, valid=False, retries=0, penalty=-2.0))
    stances = {"pro": "for", "con": "against"}
    assert reward("judge", judged, ["pro", "con", "judge"], stances=stances) == {"pro": -2.5, "con": 1.0, "judge": 0.0}
    judged.turns[0].content = {"winner": "nobody"}
    assert reward("judge", judged, ["pro", "con", "judge"], stances=stances) == {"pro": -2.0, "con": 0.0, "judge": 0.0}
    # a role outside a zero-sum game's players: its penalties were dropped, a reward of 0 whatever it sent
    duel = episode({"pro": 1.0, "con": -0.5, "judge": -1.0})
    duel.turns = [Turn(turn=0, role="judge", message_id="e:0", content=None, valid=False, retries=2, penalty=-1.0)]
    assert reward("zero-sum", duel, ["pro", "con", "judge"], players=["pro", "con"]) == {"pro": 0.75, "con": -0.75, "judge": -1.0}
    # a player's penalty is its own, not half of it a gain of the other's (pro had 1.5, con -1.5)
    lost = episode({"pro": 1.0, "con": -2.0})  # con lost the game (-1) and took -1 for an invalid turn
    lost.turns = [Turn(turn=0, role="con", message_id="e:0", content=None, valid=False, retries=2, penalty=-1.0)]
    assert reward("zero-sum", lost, ["pro", "con"]) == {"pro": 1.0, "con": -2.0}


def test_a_role_that_sat_the_episode_out_is_in_no_team_mean():
    """The other domain's teacher holds a 0 that is no result: it had pulled the team's R of
    outcome and hybrid down by a share, and given a zero-sum game's one player half its reward."""
    roles = ["teacher_largest", "teacher_smallest", "student", "student_alone"]
    ep = episode({"teacher_largest": 1.0, "teacher_smallest": 0.0, "student": 1.0, "student_alone": 0.0})
    ep.took_part = ["teacher_largest", "student", "student_alone"]
    assert reward("outcome", ep, roles) == pytest.approx(dict.fromkeys(roles, 2 / 3))
    assert reward("hybrid", ep, roles) == pytest.approx(dict.fromkeys(roles, 0.6 * 2 / 3))
    teachers = ["teacher_largest", "teacher_smallest"]
    assert reward("zero-sum", ep, roles, players=teachers) == dict.fromkeys(roles, 0.0)


def test_the_judges_last_valid_verdict_decides_at_the_configured_payoffs():
    """A verdict is the judge's own, valid and the last; named with spaces; a role's name before a stance."""
    judged = make_episode(("judge", [], {"winner": "pro"}), ("judge", [], {"winner": " Con "}), ("pro", [], {"winner": "pro"}))
    judged.turns.append(Turn(turn=3, role="judge", message_id="e:3", content={"winner": "pro"}, valid=False, retries=0, penalty=0.0))
    roles = ["pro", "con", "judge"]
    assert reward("judge", judged, roles, win=2.0, lose=-1.0) == {"pro": -1.0, "con": 2.0, "judge": 0.0}
    assert reward("judge", judged, roles, stances={"pro": "con"}) == {"pro": -0.5, "con": 1.0, "judge": 0.0}


def test_team_rewards_without_a_result_and_alpha_below_zero():
    """An outcome of None is none: R is the roles' mean; no role took part: 0; a role the env paid nothing: 0."""
    ep = episode({"a": 1.0, "b": 0.0}, {"outcome": None})
    assert reward("outcome", ep, ["a", "b"]) == {"a": 0.5, "b": 0.5}
    assert reward("env", ep, ["a", "b", "c"]) == {"a": 1.0, "b": 0.0, "c": 0.0}
    ep.took_part = []
    assert reward("outcome", ep, ["a", "b"]) == {"a": 0.0, "b": 0.0}
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        reward("hybrid", ep, ["a", "b"], alpha=-0.1)
