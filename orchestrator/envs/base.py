"""The multi-agent text environment.

An environment says whose turn it is, what that role observes (template variables), and takes
the role's validated message, returning per-role rewards. Programmatic counterparts, LLM
counterparts, self-play and team protocols (pipeline, debate) are all environments; the roles
in them are bound to policies by the orchestrator, never by the environment.
"""
from __future__ import annotations

import difflib
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, ValidationError, ValidationInfo, model_validator

from ..config import NoBoolNumbers
from ..config_errors import first_error
from ..messages import Message
from ..role import RoleSpec
from ..yamlfile import Loc, format_loc


class Options(NoBoolNumbers):
    """A block of protocol options: no unknown key, numbers finite and not booleans (a reward of
    ``.inf`` would fail every episode on its first payment instead of the file at load)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class EnvConfig(Options):
    """The ``protocol:`` block of a team file, less ``type``. Subclass it per environment."""

    # What happens after a turn that stays invalid once its retries are spent.
    on_invalid: Literal["continue", "end"] = "continue"
    # how an env that decides invalid turns itself takes them: there `on_invalid: end` is refused,
    # not ignored without a word
    invalid_turns: ClassVar[str] = ""

    @model_validator(mode="after")
    def _check_on_invalid(self) -> "EnvConfig":
        if self.invalid_turns and self.on_invalid == "end":
            raise ValueError(f"on_invalid: end is not used here: {self.invalid_turns}")
        return self

    def role_refs(self) -> list[tuple[Loc, str]]:
        """(location in this block, role name) of every role it routes to: checked at load time."""
        return []

    def turns_needed(self) -> int | None:
        """The most turns a whole game can take, where the protocol bounds it: a team whose
        ``max_turns`` is fewer is refused at load (its episodes could stop before their result)."""
        return None


class TaskConfig(NoBoolNumbers):
    """One entry of a team file's ``tasks``: the keys its environment reads, checked when the team
    loads (a subclass per environment). Other keys are kept: prompts (``{{ task.text }}``) and
    reward plugins (``episode.task``) may read them. Validators that need the protocol's options
    find them with ``task_protocol(info)``."""

    model_config = ConfigDict(extra="allow", frozen=True)


def task_protocol(info: ValidationInfo) -> EnvConfig | None:
    """In a task validator: the protocol's options (None when validated without them)."""
    return (info.context or {}).get("protocol")


def verdict_rates(who: str, verdicts: list[tuple[bool, bool | None]]) -> dict[str, float]:
    """A checking role's rates over ``(the work was right, the role accepted it)`` pairs, where
    None is no verdict (a miss either way): ``WHO_accepts_right``, ``WHO_rejects_wrong`` and,
    when both kinds were seen, their mean ``WHO_balanced_accuracy``, 0.5 for any constant verdict
    whatever the mix of right and wrong work."""
    rates = {}
    for name, right in (("accepts_right", True), ("rejects_wrong", False)):
        seen = [accepted for was_right, accepted in verdicts if was_right is right]
        if seen:
            rates[f"{who}_{name}"] = sum(accepted is right for accepted in seen) / len(seen)
    if len(rates) == 2:
        rates[f"{who}_balanced_accuracy"] = sum(rates.values()) / 2
    return rates


def whole_number(message: Message, field: str = "answer") -> int | None:
    """``message``'s ``field`` when the message is valid and it is an int (not a bool), else None."""
    value = (message.content or {}).get(field) if message.valid else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class StepResult:
    rewards: dict[str, float] = field(default_factory=dict)
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    score: float | None = None  # how good the acting role's move was, for turn-level credit (Turn.score)


class Env(ABC):
    Config: ClassVar[type[EnvConfig]] = EnvConfig
    Task: ClassVar[type[TaskConfig]] = TaskConfig
    # Template variables observe() provides, so prompts can be checked when a team loads.
    observation_keys: ClassVar[frozenset[str]] = frozenset()
    # Whether step() scores the acting role's moves (StepResult.score), for training.turn_credit.
    scores_moves: ClassVar[bool] = False

    def __init__(self, config: EnvConfig, roles: Mapping[str, RoleSpec], task: dict[str, Any], rng: random.Random):
        if problem := self.task_problem(config, task):  # load_team checked it; a task built in code may not be
            raise ValueError(f"task {format_loc(problem[0]) or '(task)'}: {problem[1]}")
        self.config = config
        self.roles = roles
        self.task = task
        self.rng = rng

    @abstractmethod
    def next_role(self) -> str | None:
        """The role to act now, or ``None`` when the episode is over."""

    @abstractmethod
    def observe(self, role: str) -> dict[str, Any]:
        """Template variables for ``role``'s prompt (only what that role may see)."""

    @abstractmethod
    async def step(self, role: str, message: Message) -> StepResult:
        """Take ``role``'s message (which may be invalid: ``message.valid`` is False)."""

    @classmethod
    def task_problem(cls, config: EnvConfig, task: dict[str, Any]) -> tuple[Loc, str] | None:
        """Where in ``task`` and what is wrong with it for this protocol, or None. A key the
        protocol does not read is fine unless it is a near miss of one it does (``secrt``)."""
        declared = cls.Task.model_fields
        missing = [name for name in declared if name not in task]
        for key in task:
            if key not in declared and (near := difflib.get_close_matches(str(key), missing, n=1, cutoff=0.75)):
                return (key,), f"unknown task key: did you mean {near[0]!r}? (this protocol reads {', '.join(declared)})"
        try:
            cls.Task.model_validate(task, context={"protocol": config})
        except ValidationError as exc:
            return first_error(exc, task, cls.Task)
        except Exception as exc:  # a plugin's Task validator's own bug (pydantic passes it through): one line
            return (), f"{cls.__name__}.Task raised {type(exc).__name__}: {exc}"
        return None

    @classmethod
    def observes(cls, config: EnvConfig, role: str) -> frozenset[str]:
        """The keys of ``observation_keys`` that ``observe(role)`` gives: a protocol whose view
        leaves a key out for some roles (a secret) says so here, so a template of such a role
        that reads it fails when the team loads, not in every episode."""
        return cls.observation_keys

    @classmethod
    def reads(cls, config: EnvConfig, role: str) -> dict[str, list[Any] | None]:
        """The fields of ``role``'s messages that ``step`` reads, each with the values it looks for
        (None: any). Checked when the team loads: each must be a property of the role's output
        schema, and a value its ``enum`` lacks could never come (a role written for another
        protocol otherwise failed every episode with a KeyError, or never met a condition)."""
        return {}

    @classmethod
    def task_from_cli(cls, value: str) -> dict[str, Any]:
        """The task dict for ``rolecast run --task VALUE`` (environments override the meaning); a
        ValueError for a value the environment cannot take."""
        return {"text": value}

    def recipients(self, sender: str) -> list[str]:
        return [name for name in self.roles if name != sender]

    def outcome(self) -> dict[str, Any]:
        """What the transcript should record about how the episode ended."""
        return {}

    @classmethod
    def outcome_metrics(cls, config: EnvConfig, outcomes: list[dict[str, Any]]) -> dict[str, float]:
        """Scalars over the outcomes of a run's finished episodes, reported beside its rewards (in
        summary.json's ``env``, and as ``eval_env/NAME`` in a training run's evaluation rows):
        what a reward can hide, such as a Judge that gives one verdict whatever it is shown."""
        return {}

    async def close(self) -> None:
        """Release what the episode held (temp dirs, processes); called once, however it ended."""
