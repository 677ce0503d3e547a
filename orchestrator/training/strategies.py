"""How a team can learn, as changes to its recipe: what ``rolecast compare`` puts side by side.

    grpo           each role its own adapter and its own group-relative baseline (independent learners)
    freeze-rotate  one role learns at a time for ``every`` steps while the others stay frozen
    m-grpo         every role gets the team's advantage (the team reward against the group's)
    dr-mas         each role against its own rewards, scaled by their std (Dr. MAS's agent-wise normalisation)
    shared         one adapter for every role, GRPO's advantages: a single model plays all parts

Everything else (reward, steps, group sizes, evaluation, seed) is the recipe's, so runs of one
recipe differ only in the strategy.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..evaluation import with_adapter
from ..team import Team, trainable_roles

SHARED_ADAPTER = "shared"
STRATEGIES: dict[str, dict[str, Any]] = {
    "grpo": {"trainer": "grpo", "trainer_config": {}},
    "freeze-rotate": {"trainer": "freeze-rotate", "trainer_config": {}},  # "every" comes from compare
    "m-grpo": {"trainer": "m-grpo", "trainer_config": {"baseline": "team"}},
    "dr-mas": {"trainer": "m-grpo", "trainer_config": {"baseline": "per_role", "scale_std": True}},
    "shared": {"trainer": "grpo", "trainer_config": {}},
}


def with_strategy(team: Team, name: str, every: int = 5) -> Team:
    """``team`` trained the way ``name`` says (its training block and, for ``shared``, its adapters)."""
    if team.config.training is None:
        raise ValueError(f"{team.path}: the recipe has no `training:` block")
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}: use one of {', '.join(STRATEGIES)}")
    update = dict(STRATEGIES[name])
    if name == "freeze-rotate":
        update["trainer_config"] = {"every": every}
    training = team.config.training.model_copy(update=update)
    team = dataclasses.replace(team, config=team.config.model_copy(update={"training": training}))
    if name == "shared":  # the roles that learn; one bound elsewhere (builtin:, replay:) stays bound
        learners = trainable_roles(team.roles)
        # a frozen role sampling a learner's adapter (teacher_student's student_alone, the student's
        # no-example baseline) follows it: left on the old name it played an adapter nothing trains
        adapters = set(learners.values())
        roles = {n: with_adapter(s, SHARED_ADAPTER)
                 if n in learners or (s.binding is None and s.config.policy.adapter in adapters) else s
                 for n, s in team.roles.items()}
        team = dataclasses.replace(team, roles=roles)
    return team
