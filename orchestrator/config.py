"""The strict schemas of role and team YAML files (pydantic v2, ``extra="forbid"``).

Loading, reference checks and compiled forms live in ``role`` and ``team``; this
module only says what a valid file looks like.
"""
from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError, ValidationError

from sandboxes import ISOLATING

SEED_MAX = 2**63 - 1  # seeds reach the sampler's counter-based streams as int64
# Below these, logits / temperature overflows and top_p rounds to 0 in float32 (0 is greedy).
MIN_TEMPERATURE, MIN_TOP_P = 1e-3, 1e-6

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_\-]*$"
# An adapter's name names its folders (sampler/NAME, a checkpoint's .NAME.tmp-XXXXXXXX, a snapshot's
# pool/NAME@STEP): one past a file system's 255 bytes failed training at its first write, a traceback.
ADAPTER_NAME_MAX = 128
SET_BY_TRAIN = "set_by_train"  # a field's json_schema_extra key: why a recipe may not set it


def set_by_train(model: type[BaseModel]) -> dict[str, str]:
    """The fields of ``model`` that `rolecast train` sets and a recipe may not, each with why."""
    return {name: f.json_schema_extra[SET_BY_TRAIN] for name, f in model.model_fields.items()
            if isinstance(f.json_schema_extra, dict) and SET_BY_TRAIN in f.json_schema_extra}


def _bool_at(value: Any) -> tuple[tuple, bool] | None:
    """Where in ``value`` a boolean is (its keys and indexes; () for ``value`` itself) and which, or None."""
    if isinstance(value, bool):
        return (), value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        if found := _bool_at(item):
            return (key, *found[0]), found[1]
    return None


def _leaves(annotation: Any) -> list[Any]:
    """The scalar types and models a field of this type holds (``dict[str, float]``: str, float)."""
    args = typing.get_args(annotation)
    if not args or typing.get_origin(annotation) is Literal:
        return [annotation]
    return [leaf for arg in args for leaf in _leaves(arg)]


def _numbers_only(annotation: Any) -> bool:
    """Whether a field's scalars are numbers: no bool, no Any, no model (a model checks its own fields)."""
    leaves = _leaves(annotation)
    return any(t in (int, float) for t in leaves) and not any(
        t in (bool, Any) or isinstance(t, type) and issubclass(t, BaseModel) for t in leaves)


class NoBoolNumbers(BaseModel):
    """Config models whose numbers are not booleans: lax pydantic read ``steps: yes`` as 1 and
    ``temperature: true`` as 1.0 (strict mode would refuse ``1e-4``, which YAML reads as a string)."""

    @field_validator("*", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any, info: ValidationInfo) -> Any:
        if (found := _bool_at(value)) and _numbers_only(cls.model_fields[info.field_name].annotation):
            # an error at the boolean's own key (`echo` in `repetition_penalty: {echo: on}`), not only the field's
            raise ValidationError.from_exception_data(cls.__name__, [{
                "type": PydanticCustomError("bool_number", "must be a number, not a boolean"), "loc": found[0],
                "input": found[1]}])
        return value


class Strict(NoBoolNumbers):
    # Numbers finite: an inf learning rate or LoRA alpha ('1e400' reads as inf) made the weights NaN
    # after one step, and an inf penalty every mean -inf, where the file could have said so.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PluginConfig(Strict):
    """A plugin's options: a trainer's ``trainer_config``, a reward's ``reward_config``, a loss's
    ``loss_config``. Subclass it with a default and a description for every field; unknown keys
    are errors, so a misspelt option fails ``rolecast validate`` instead of being ignored."""

    def check_roles(self, roles: list[str]) -> None:
        """Raise ValueError where an option names a role the team lacks (``roles``: all of them).
        Called at load: a misspelt role would otherwise read as a reward of 0, and teach nothing."""

    def reads(self, role: str) -> dict[str, list[Any] | None]:
        """The fields of ``role``'s messages the plugin reads, as ``Env.reads``: each checked at load
        against the role's output schema (a judge's misspelt verdict field named no winner, ever)."""
        return {}


Aggregation = Literal["token-sum", "token-mean", "sequence-mean"]


class LossConfig(PluginConfig):
    """What every loss reads (``training/losses.py`` has the equations)."""

    aggregation: Aggregation = Field("token-sum", description="how per-token losses reduce to the batch's loss")
    kl_coef: float = Field(0.0, ge=0.0, description="beta of the k3 KL penalty to the base model; 0 = none")
    entropy_coef: float = Field(
        0.0, ge=0.0, description="weight of the entropy bonus (over the grammar's allowed tokens where constrained); 0 = none")
    # In a recipe these are not options (SET_BY_TRAIN says why): `rolecast train` sets the
    # temperature from each role's sampling.temperature, and the batch's counts where one
    # adapter's batch goes in several calls (roles at other temperatures, or with loss options of
    # their own), so that a mean is over the whole batch, as the aggregation says, not per call.
    temperature: float = Field(1.0, ge=0.0, description="temperature the actions were sampled at (0 is read as 1)",
                               json_schema_extra={SET_BY_TRAIN: "each role's policy.sampling.temperature is used"})
    batch_tokens: float | None = Field(None, gt=0, json_schema_extra={SET_BY_TRAIN: "rolecast train counts each batch"},
                                       description="action tokens of the batch this call is part of (None: its own)")
    batch_sequences: int | None = Field(None, ge=1, json_schema_extra={SET_BY_TRAIN: "rolecast train counts each batch"},
                                        description="datums of the batch this call is part of (None: its own)")


class PPOConfig(LossConfig):
    clip_low_threshold: float = Field(0.8, ge=0.0, le=1.0, description="lower bound of the clipped ratio")
    clip_high_threshold: float = Field(1.2, ge=1.0, description="upper bound of the clipped ratio")


# What `rolecast train` adds under a recipe's loss_config (the client's own default is token-sum):
# a mean keeps the step size independent of how long the replies are.
RECIPE_LOSS_DEFAULTS = {"aggregation": "token-mean"}

LOSS_CONFIGS: dict[str, type[LossConfig]] = {
    "cross_entropy": LossConfig,
    "importance_sampling": LossConfig,
    "ppo": PPOConfig,
}


class SandboxOptions(Strict):
    """Where an environment runs the team's code (``protocol.sandbox``)."""

    backend: str = Field("auto", description="auto, or an isolating backend (bwrap, unshare)")
    memory_mb: int = Field(1024, ge=64)
    timeout_s: float | None = Field(None, gt=0, description="per test run; default: the task's timeout_s")
    max_concurrent: int | None = Field(
        None, ge=1, description="sandboxed runs at once, all episodes together; default: the CPU count")

    @field_validator("backend")
    @classmethod
    def _isolating(cls, value: str) -> str:
        if value not in ("auto", *ISOLATING):
            raise ValueError(f"must be auto or one of {', '.join(ISOLATING)} (the team's code is untrusted)")
        return value


class SamplingConfig(Strict):
    temperature: float = Field(0.8, ge=0.0, le=5.0, description=f"0 (greedy), or {MIN_TEMPERATURE} to 5")
    top_p: float = Field(1.0, ge=MIN_TOP_P, le=1.0)
    max_tokens: int = Field(256, ge=1, le=32768)
    stop: list[str] = Field(default_factory=list)

    @field_validator("temperature")
    @classmethod
    def _not_tiny(cls, value: float) -> float:
        if 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE}")
        return value


class PolicyConfig(Strict):
    adapter: str | None = Field(None, pattern=NAME_PATTERN, max_length=ADAPTER_NAME_MAX,
                                description="LoRA adapter; null = base model")
    trainable: bool = True
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    # What produces this role's text: null = the team's model engine; otherwise a binding such
    # as "replay:FILE", "python:pkg.mod:fn" or "builtin:NAME" (the CLI's --policy overrides it).
    bind: str | None = None


class RoleConfig(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(min_length=1)
    prompt: str = Field(min_length=1, description="Jinja2 template path, relative to the YAML file")
    # A role with a followup template keeps its conversation within an episode: its later turns
    # add its own last reply and this template's message to what it saw before, so turns extend
    # one another token for token (one training sequence per episode, not one per turn).
    followup: str | None = Field(None, min_length=1, description="Jinja2 template path for turns after the first")
    system: str | None = Field(None, description="system message; default (null): name and description; empty: none")
    # Text the model's reply is made to start with (e.g. '{"verdict": "'): it goes into the prompt
    # after the assistant tag and is prepended to the sampled text before parsing. Small models
    # that never start a JSON object on their own mostly finish one they are handed.
    reply_prefix: str = ""
    # constrained: the engine masks, at every step, the tokens the output schema does not allow,
    # so every model message is valid (docs/constrained.md); free: the model writes what it likes
    # and invalid replies are retried.
    decoding: Literal["constrained", "free"] = "constrained"
    output_schema: dict[str, Any] | str
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    max_retries: int = Field(2, ge=0, le=20)
    # at most 0: a positive one (a sign slip, "a penalty of 1") paid the replies the retries are there to stop
    invalid_penalty: float = Field(-1.0, le=0.0, description="reward added for a turn still invalid after retries")
    params: dict[str, Any] = Field(default_factory=dict, description="template parameters, e.g. a stance")


class ProtocolRef(BaseModel):
    """``protocol:`` in a team: ``type`` names an environment plugin; the rest is its config."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str = Field(pattern=NAME_PATTERN)


class AdamConfig(Strict):
    learning_rate: float = Field(5e-5, gt=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(1.0, ge=0, description="0 = no clipping")


class LoraSpec(Strict):
    rank: int = Field(16, ge=1, le=512)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(  # [] refused when the file loads: `validate` passed it, training stopped
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], min_length=1
    )

    @field_validator("target_modules")
    @classmethod
    def _inner_linears(cls, value: list[str]) -> list[str]:
        """The LM head and the embeddings carry no LoRA: training takes log-probs through the
        base head (only the positions the loss needs), so such an adapter would never train."""
        if outer := sorted(set(value) & {"lm_head", "embed_tokens"}):
            raise ValueError(f"{', '.join(outer)}: not a module a LoRA here can target (the model's inner linear "
                             "layers: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")
        return value


class TrainingConfig(Strict):
    """The ``training:`` block of a recipe: what ``rolecast train`` does each step."""

    # The *_config blocks are checked against the named plugin's Config when the team loads
    # (team.py), since which model applies depends on the plugin named beside them.
    trainer: str = Field("grpo", description="trainer plugin")
    trainer_config: dict[str, Any] = Field(default_factory=dict, description="the trainer's Config")
    reward: str = Field("env", description="reward plugin: env, outcome, hybrid, zero-sum, judge, ...")
    reward_config: dict[str, Any] = Field(default_factory=dict, description="the reward's Config")
    steps: int = Field(20, ge=1)
    group_size: int = Field(8, ge=1, description="episodes per task; their rewards are compared")
    groups_per_step: int = Field(4, ge=1, description="tasks per step")
    loss: Literal["cross_entropy", "importance_sampling", "ppo"] = "ppo"
    ppo_epochs: int = Field(1, ge=1, le=64, description=(
        "passes over each step's datums; passes after the first are off-policy, so clipping bites"))
    minibatches: int = Field(1, ge=1, description="optimizer steps per pass: the datums split into this many")
    joint_passes: bool | None = Field(None, description=(
        "several adapters' datums share forward/backward passes (each row through its own adapter) "
        "instead of a pass per adapter: fewer, larger passes (docs/training.md); default: on a GPU, "
        "where a small model's passes cost their launches, not on a CPU"))
    max_staleness: int = Field(0, ge=0, le=8, description=(
        "async training: rollouts of this many later steps sample while a step trains; their turns "
        "may be this many adapter versions old (PPO's ratio corrects them), older ones are dropped"))
    loss_config: dict[str, Any] = Field(default_factory=dict, description=(
        "the loss's Config (LOSS_CONFIGS), less temperature; aggregation defaults to token-mean here"))
    role_loss_config: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "per trainable role, loss options that replace loss_config's for that role's tokens "
        "(an entropy bonus for the one role that must explore, say)"))
    repetition_penalty: dict[str, float] = Field(default_factory=dict, description=(
        "per trainable role, lambda: its reward falls by lambda times the share of the step's other "
        "episodes in which it sent the same messages (R-Zero's; training/repetition.py)"))
    turn_credit: float = Field(0.0, ge=0, description=(
        "w: each scored turn of a role also gets w * (its score - the mean score of the role's turns at "
        "that position in the group), beside the episode's advantage; needs an env that scores moves "
        "(guess_number) (training/turn_credit.py)"))
    history_credit: float = Field(0.0, ge=0, description=(
        "w: each turn of a role whose prompt tokens another turn of the step saw too also gets "
        "w * (its episode reward - the mean reward of those turns), across the step's groups "
        "(training/turn_credit.py)"))
    adam: AdamConfig = Field(default_factory=AdamConfig)
    lora: LoraSpec = Field(default_factory=LoraSpec)
    invalid: Literal["penalize", "drop"] = Field("penalize", description="what training does with invalid attempts")
    invalid_advantage: float = -1.0
    eval_every: int = Field(10, ge=0, description="0 = only at the start and the end")
    eval_episodes: int = Field(64, ge=1)
    eval_tasks: list[dict[str, Any]] | str | None = Field(None, description="held-out tasks; default: the team's")
    eval_opponent: str | None = Field(
        None, description="evaluate against this opponent: random, minimax (any builtin), base or checkpoint:PATH")
    checkpoint_every: int = Field(5, ge=1)
    keep_checkpoints: int = Field(3, ge=1)


TEAM_KEYS = frozenset({"protocol", "roles", "tasks"})  # keys only a team file has


class TeamConfig(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    protocol: ProtocolRef
    roles: list[dict[str, Any]] = Field(min_length=1, description="entries: {use: NAME|PATH, ...overrides}")
    tasks: list[dict[str, Any]] | str = Field(description="inline list, or a .jsonl/.yaml path")
    model: str = "smollm2-135m"
    episodes: int = Field(1, ge=1)
    seed: int = Field(0, ge=0, le=SEED_MAX)
    concurrency: int = Field(16, ge=1)
    episode_timeout_s: float = Field(900.0, gt=0)
    max_turns: int = Field(64, ge=1, description="safety cap on turns per episode")
    training: TrainingConfig | None = None
