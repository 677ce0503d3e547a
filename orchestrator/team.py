"""Loading a team (or recipe) file: roles from the library or paths, the protocol, the tasks.

Everything that can be checked without running is checked here: unknown keys and types, the
protocol plugin, roles the protocol routes to, duplicate role names, prompt templates and the
variables they use, output schemas, policy bindings, the tasks against the protocol's task
model, the training block's plugins, their options, and the trainer against the team's
trainable roles.
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .config import LOSS_CONFIGS, TeamConfig, TrainingConfig, set_by_train
from .envs.base import Env, EnvConfig
from .errors import ConfigError, RolecastError
from .registry import Registry, config_model, default_registry
from .role import BASE_VARIABLES, RoleSpec, library_roles, load_role, resolve_role_path
from .config_errors import ErrorSite, first_error, validate_model
from .training.plugin_faults import said_as
from .training.trainer import build_trainer
from .yamlfile import Loc, YamlDoc, format_loc, inline_doc, load_json_lines, load_yaml, not_json, plain_copy, unnameable


@dataclass(frozen=True)
class Team:
    config: TeamConfig
    path: Path
    roles: dict[str, RoleSpec]
    env_class: type[Env]
    env_config: EnvConfig
    tasks: list[dict[str, Any]]
    eval_tasks: list[dict[str, Any]] | None = None  # training.eval_tasks, loaded

    @property
    def name(self) -> str:
        return self.config.name

    def make_env(self, task: dict[str, Any], rng: random.Random) -> Env:
        return self.env_class(self.env_config, self.roles, task, rng)

    def resolved(self) -> dict[str, Any]:
        """The config as it will run, for the run dir: roles after overrides, schemas inlined."""
        config = self.config.model_dump(mode="json", exclude={"roles", "tasks"})
        if self.eval_tasks is not None:  # as the tasks: what a file held, so a --resume sees it edited
            config["training"]["eval_tasks"] = self.eval_tasks
        return {
            **config,
            "roles": [
                {**spec.config.model_dump(mode="json"), "output_schema": spec.schema, "prompt": str(spec.template_path),
                 # as the prompt: the file read, not a path relative to a YAML file the run dir lacks
                 "followup": spec.followup_template and spec.followup_template.filename}
                for spec in self.roles.values()
            ],
            "tasks": self.tasks,
        }


CHECKPOINT_ADAPTER = "eval-opponent"  # the adapter a checkpoint:PATH opponent is loaded as


def trainable_roles(roles: dict[str, RoleSpec]) -> dict[str, str]:
    """role -> adapter for the roles that learn: trainable, with an adapter, bound to the model."""
    out = {}
    for name, spec in roles.items():
        p = spec.config.policy
        if p.trainable and p.adapter and spec.binding is None:
            out[name] = p.adapter
    return out


def load_team(source: str | Path | Mapping[str, Any], registry: Registry | None = None) -> Team:
    """The team in file ``source``, or given as its mapping (a team written in code: paths in it
    are relative to the current folder), checked."""
    registry = registry or default_registry()
    doc = inline_doc(source, "<inline team>") if isinstance(source, Mapping) else load_yaml(source)
    if not isinstance(doc.data, dict):
        raise doc.error((), "a team file must be a mapping of keys")
    config: TeamConfig = validate_model(TeamConfig, doc.data, doc)

    env_class, env_config = _load_protocol(config, doc, registry)
    roles = _load_roles(config, doc, registry)
    env = f"env plugin {config.protocol.type!r}"  # its hooks' own faults: one line naming the hook
    with _plugin_code(doc, ("protocol", "type"), f"{env}: role_refs"):
        for loc, name in env_config.role_refs():
            if name not in roles:
                raise doc.error(("protocol",) + loc, f"routes to unknown role {name!r} (team roles: {', '.join(roles)})")
    with _plugin_code(doc, ("protocol", "type"), f"{env}: turns_needed"):
        needed = env_config.turns_needed()
    if needed is not None and needed > config.max_turns:  # every episode would end at max_turns, without a result
        raise doc.error(("max_turns",) if "max_turns" in doc.data else ("protocol",),
                        f"a whole game can take {needed} turns and max_turns is {config.max_turns}: episodes "
                        "would stop before their result (raise max_turns)")
    for name, spec in roles.items():
        # what they give is used in the net too: observation_keys as a list, say, failed the set union
        with _plugin_code(doc, ("protocol", "type"), f"{env}: observes or reads"):
            seen, read = env_class.observes(env_config, name), env_class.reads(env_config, name)
            _check_template_variables(spec, seen, config.protocol.type)
            _check_reads(doc, env_class.__name__, spec, read)
    tasks = _load_tasks(config.tasks, doc, ("tasks",), env_class, env_config)
    eval_tasks = None
    if config.training is not None:
        _check_training(config.training, roles, env_class, doc, registry)
        _check_adapter_case(roles, doc)
        if config.training.eval_opponent and (problem := opponent_problem(config.training.eval_opponent, env_config, registry, roles)):
            raise doc.error(("training", "eval_opponent"), problem)
        if config.training.eval_tasks is not None:
            eval_tasks = _load_tasks(config.training.eval_tasks, doc, ("training", "eval_tasks"), env_class, env_config)
    return Team(config=config, path=doc.path, roles=roles, env_class=env_class, env_config=env_config,
                tasks=tasks, eval_tasks=eval_tasks)


def opponent_problem(opponent: str, env_config: EnvConfig, registry: Registry, roles: dict[str, RoleSpec]) -> str | None:
    """What is wrong with ``opponent`` (``base``, ``checkpoint:PATH``, ``builtin:NAME`` or a policy
    name) as the opponent of a team with this protocol and ``roles``, or None: for ``--opponent`` and
    ``training.eval_opponent`` alike, so a recipe's typo is caught when it loads."""
    declared = getattr(env_config, "opponent_role", None)
    if declared is None or declared() is None:
        return "the protocol declares no opponent role (protocol key `opponent:`)"
    kind, _, target = opponent.partition(":")
    if opponent == "base":
        return None
    if kind == "checkpoint":
        # the engine holds one adapter a name: a learner of that name overwrote the checkpoint, unsaid
        if taken := [name for name, spec in roles.items() if spec.config.policy.adapter == CHECKPOINT_ADAPTER]:
            return (f"role {taken[0]!r} plays adapter {CHECKPOINT_ADAPTER!r}, the name a checkpoint opponent is loaded "
                    "under: give that adapter another name")
        return None if (Path(target) / "adapter_config.json").is_file() else "not a PEFT adapter dir (no adapter_config.json)"
    if (target if kind == "builtin" else opponent) not in registry.items["policies"]:
        return f"unknown opponent {opponent!r} (use one of {', '.join(['base', 'checkpoint:PATH'] + registry.names('policies'))})"
    return None


def _load_protocol(config: TeamConfig, doc: YamlDoc, registry: Registry) -> tuple[type[Env], EnvConfig]:
    try:
        env_class = registry.get("envs", config.protocol.type)
    except KeyError as exc:
        raise doc.error(("protocol", "type"), exc.args[0]) from None
    options = {k: v for k, v in doc.data["protocol"].items() if k != "type"}
    with _plugin_code(doc, ("protocol", "type"), f"env plugin {config.protocol.type!r}: its Config"):
        try:
            return env_class, env_class.Config.model_validate(options)
        except ValidationError as exc:
            loc, problem = first_error(exc, options, env_class.Config)
            raise doc.error(("protocol", *loc), problem) from None


def _check_training(training: TrainingConfig, roles: dict[str, RoleSpec], env_class: type[Env], doc: ErrorSite,
                    registry: Registry) -> None:
    """The trainer and reward plugins exist, their options and the loss's fit their Configs, the
    trainer takes the team's trainable roles (self-play needs two players, ...), and turn credit
    has moves scored to work with."""
    if training.turn_credit and not env_class.scores_moves:
        raise doc.error(("training", "turn_credit"), f"protocol {env_class.__name__} does not score moves, so turn "
                        "credit has nothing to work with: leave it 0 (guess_number scores its guesses)")
    for kind, key in (("trainers", "trainer"), ("rewards", "reward")):
        try:
            plugin = registry.get(kind, getattr(training, key))
        except KeyError as exc:
            raise doc.error(("training", key), exc.args[0]) from None
        with _plugin_code(doc, ("training", key), f"{key} plugin {getattr(training, key)!r}: its Config"):
            options = validate_model(config_model(plugin), getattr(training, f"{key}_config"), doc, ("training", f"{key}_config"))
        with _plugin_code(doc, ("training", key), f"{key} plugin {getattr(training, key)!r}: check_roles"):
            try:
                if callable(check := getattr(options, "check_roles", None)):  # a Config not derived from PluginConfig has none
                    check(list(roles))
            except ValueError as exc:
                raise doc.error(("training", f"{key}_config"), str(exc)) from None
        with _plugin_code(doc, ("training", key), f"{key} plugin {getattr(training, key)!r}: reads"):
            if callable(reads := getattr(options, "reads", None)):
                for name, spec in roles.items():
                    _check_reads(doc, f"{key} plugin {getattr(training, key)!r}", spec, reads(name),
                                 ("training", f"{key}_config"))
    if not (learning := trainable_roles(roles)):
        raise doc.error(("training",), "no role learns: give one `trainable: true` and an adapter, bound to the model")
    with _plugin_code(doc, ("training", "trainer"), f"trainer plugin {training.trainer!r}: __init__"):
        try:
            build_trainer(registry.get("trainers", training.trainer), learning, training.trainer_config,
                          training.group_size * training.groups_per_step)
        except ValueError as exc:
            raise doc.error(("training", "trainer_config"), str(exc)) from None
    for where, options in [(("loss_config",), training.loss_config)] + [
            (("role_loss_config", role), options) for role, options in training.role_loss_config.items()]:
        if len(where) == 2 and where[1] not in learning:
            raise doc.error(("training", *where), f"not a role that learns (those that do: {', '.join(learning)})")
        reasons = set_by_train(LOSS_CONFIGS[training.loss])  # a value here would be overwritten
        if taken := sorted(set(options) & set(reasons)):
            raise doc.error(("training", *where, taken[0]), f"not an option: {reasons[taken[0]]}")
        validate_model(LOSS_CONFIGS[training.loss], options, doc, ("training", *where))
    for role, weight in training.repetition_penalty.items():
        if role not in learning:
            raise doc.error(("training", "repetition_penalty", role), f"not a role that learns (those that do: {', '.join(learning)})")
        if not weight >= 0:
            raise doc.error(("training", "repetition_penalty", role), f"must be 0 or more, got {weight}")


def _check_adapter_case(roles: dict[str, RoleSpec], doc: YamlDoc) -> None:
    """No two learners' adapters differ only by case: each names folders (sampler/NAME, a checkpoint's
    adapters/NAME), which are one folder on a case-insensitive file system (macOS's, Windows'): Coder's
    and coder's weights would overwrite each other there."""
    learning, seen = trainable_roles(roles), {}
    for i, name in enumerate(roles):  # in the team's order: roles[i] of the file
        adapter = learning.get(name)
        if adapter and (other := seen.setdefault(adapter.casefold(), adapter)) != adapter:
            raise doc.error(("roles", i, "policy", "adapter"), f"adapter {adapter!r} differs from {other!r} only by case: "
                            "their folders would be one on a case-insensitive file system (macOS, Windows)")


def _plugin_code(doc: ErrorSite, loc: Loc, what: str) -> contextlib.AbstractContextManager[None]:
    """A plugin's code run while the team loads: its own bug is one line naming it, not a traceback."""
    return said_as(lambda said: doc.error(loc, said), what)


# Training options that may change after load (``--set``, ``rolecast.train(sets=...)``): budgets
# and optimizer knobs. The plugin choices stay the recipe's; their options change one at a time.
NOT_SETTABLE = ("trainer", "reward", "eval_tasks", "eval_opponent")
PLUGIN_OPTIONS = ("trainer_config", "reward_config", "loss_config")


class _SetOptions:
    def error(self, loc: Loc, problem: str) -> RolecastError:
        return RolecastError(f"--set: {format_loc(loc[1:])}: {problem}")  # loc[0] is "training"


def with_training_options(team: Team, options: Mapping[str, Any], registry: Registry | None = None) -> Team:
    """``team`` with these training options changed (``{"group_size": 4, "adam.learning_rate":
    1e-4, "trainer_config.members": 8, "role_loss_config.ROLE.entropy_coef": 0.1}``), checked as
    the recipe's own training block is when it loads; ``team`` itself is not changed."""
    registry = registry or default_registry()
    if not options:
        return team
    if team.config.training is None:
        raise RolecastError(f"--set: {team.path} has no `training:` block")
    data = team.config.training.model_dump()
    for key, value in options.items():
        path = str(key).split(".")
        per_role = path[0] == "role_loss_config"
        if path[0] not in data or path[0] in NOT_SETTABLE or (path[0] in PLUGIN_OPTIONS and len(path) < 2) \
                or (per_role and len(path) != 3):
            settable = ", ".join(k for k in data if k not in NOT_SETTABLE + PLUGIN_OPTIONS + ("role_loss_config",))
            raise RolecastError(f"--set {key}: not a settable option; use one of {settable} (or adam.X, lora.X, "
                                "trainer_config.X, reward_config.X, loss_config.X, role_loss_config.ROLE.X, repetition_penalty.ROLE)")
        if per_role:
            data["role_loss_config"].setdefault(path[1], {})
        node = data
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                raise RolecastError(f"--set {key}: not an option")
        try:  # config.yaml records it: a numpy float32 there failed its write, after the model loaded
            node[path[-1]] = plain_copy(value)
        except ValueError as exc:
            raise RolecastError(f"--set {key}: {exc}") from None
    site = _SetOptions()
    training = validate_model(TrainingConfig, data, site, ("training",))
    _check_training(training, team.roles, team.env_class, site, registry)
    return dataclasses.replace(team, config=team.config.model_copy(update={"training": training}))


def _load_roles(config: TeamConfig, doc: YamlDoc, registry: Registry) -> dict[str, RoleSpec]:
    roles: dict[str, RoleSpec] = {}
    for i, entry in enumerate(config.roles):
        ref = entry.get("use")
        if not isinstance(ref, str) or not ref:
            raise doc.error(("roles", i, "use"), "each role entry needs `use: NAME` (a library role) or `use: PATH`")
        path = resolve_role_path(ref, doc.path.parent)
        if path is None:
            raise doc.error(
                ("roles", i, "use"),
                unnameable(ref) or f"unknown role {ref!r}: not a library role ({', '.join(library_roles())}) nor an existing file",
            )
        overrides = {k: v for k, v in entry.items() if k != "use"}
        spec = load_role(path, overrides, override_doc=doc, override_loc=("roles", i), registry=registry)
        if spec.name in roles:
            loc = ("roles", i, "name") if "name" in entry else ("roles", i, "use")
            raise doc.error(loc, f"duplicate role name {spec.name!r}: give one of them another `name:`")
        roles[spec.name] = spec
    return roles


def _check_reads(doc: ErrorSite, protocol: str, spec: RoleSpec, read: Mapping[str, list[Any] | None],
                 loc: Loc = ("protocol",)) -> None:
    """The fields the protocol (or a plugin) reads of ``spec``'s messages are properties of its
    schema, and the values it looks for are ones their ``enum`` allows; an error at ``loc``."""
    declared = spec.schema.get("properties")
    if not isinstance(declared, dict):  # none at the root (a root $ref): not checked
        return
    if missing := sorted(set(read) - set(declared)):
        raise doc.error(loc, f"{protocol} reads field(s) {', '.join(missing)} of the messages of role "
                        f"{spec.name!r}, which its output_schema does not declare (properties: {', '.join(declared) or 'none'})")
    for field, values in read.items():
        allowed = declared[field].get("enum") if isinstance(declared[field], dict) else None
        if values and isinstance(allowed, list) and (never := [v for v in values if v not in allowed]):
            raise doc.error(loc, f"{protocol} waits for {field} {', '.join(map(repr, never))} from role "
                            f"{spec.name!r}, which its output_schema's enum never allows ({', '.join(map(repr, allowed))})")


def _check_template_variables(spec: RoleSpec, seen: frozenset[str], protocol: str) -> None:
    """``spec``'s templates read only the base variables, its globals and ``seen`` (what it observes)."""
    allowed = BASE_VARIABLES | seen | set(spec.template.environment.globals)
    unknown = sorted(set(spec.variables) - allowed)
    if not unknown:
        return
    file, line, key = spec.variables[unknown[0]]
    here = [name for name in unknown if spec.variables[name][::2] == (file, key)]  # those read at the same file and key
    raise ConfigError(
        file,
        line,
        key,
        f"template uses undefined variable(s) {', '.join(here)}; "
        f"available to role {spec.name!r} with protocol {protocol}: "
        f"{', '.join(sorted(allowed - set(spec.template.environment.globals)))}",
    )


def _load_tasks(tasks: list[dict[str, Any]] | str, doc: YamlDoc, loc: tuple, env_class: type[Env],
                env_config: EnvConfig) -> list[dict[str, Any]]:
    """The tasks, inline or from a YAML or JSON-lines file, each checked against the protocol's
    task model; an error names the task's own file and line."""
    if isinstance(tasks, list):
        if not tasks:
            raise doc.error(loc, "at least one task is needed")
        items, where = tasks, lambda i, key, problem: doc.error(loc + (i,) + key, problem)
    else:
        path = doc.file(loc, tasks)
        try:
            if path.suffix.lower() == ".jsonl":
                lines = load_json_lines(path)
                items, where = [v for _, v in lines], lambda i, key, problem: ConfigError(
                    path, lines[i][0], format_loc(key) or "(task)", problem)
            else:
                file_doc = load_yaml(path)
                items, where = file_doc.data, lambda i, key, problem: file_doc.error((i,) + key, problem)
        except ConfigError as exc:
            if exc.key != "(file)" or exc.line is not None:
                raise  # a problem inside the tasks file (a byte that is not UTF-8 too), named at its own line
            raise doc.error(loc, f"cannot read tasks file {path}: {exc.problem}") from None
        if not isinstance(items, list) or not items:
            raise doc.error(loc, f"tasks file {path} must hold a non-empty list of mappings")
    for i, task in enumerate(items):
        if not isinstance(task, dict):  # in a file (inline ones the config checked): named at its own line
            raise where(i, (), f"a task must be a mapping, not {type(task).__name__}")
        if problem := not_json(task):  # a task goes into transcripts.jsonl: a YAML date failed the run there
            raise where(i, *problem)
        if problem := env_class.task_problem(env_config, task):
            raise where(i, *problem)
    return items
