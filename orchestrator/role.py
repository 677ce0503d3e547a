"""Loading a role: its YAML, compiled prompt template, and compiled output-schema validator."""
from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
from pydantic import ValidationError

import roles as _library

from .config import TEAM_KEYS, RoleConfig
from .errors import ConfigError
from .grammar.enforceable import check_enforceable
from .grammar.schema import GrammarError, check_free_reply_prefix, check_reply_prefix
from .messages import check_schema, compile_validator, schema_json
from .policies.binding import Binding, parse_binding
from .registry import Registry, default_registry
from .config_errors import first_error
from .yamlfile import MAX_YAML_BYTES, Loc, YamlDoc, json_object, load_yaml, not_json, read_text

LIBRARY_DIR = Path(_library.__file__).resolve().parent
# Variables every prompt template may use; environments add their own observation keys.
BASE_VARIABLES = frozenset({"task", "role", "description", "params", "schema"})
DEFAULT_SYSTEM = "You are the {{ role }}. {{ description }}"
Site = tuple[str, int | None, str]  # file, line, key: where a template reads a variable


@dataclass(frozen=True, eq=False)
class RoleSpec:
    """A role ready to run: validated config, compiled templates and validator."""

    config: RoleConfig
    source: Path
    template: jinja2.Template
    template_path: Path
    system_template: jinja2.Template
    schema: dict[str, Any]
    variables: dict[str, Site]  # top-level names the templates read, each where it is first read
    binding: Binding | None = None  # policy.bind, parsed and checked; None = the model engine
    followup_template: jinja2.Template | None = None  # later turns' message (a conversation role)
    grammar_sites: dict[str, Site] = field(default_factory=dict)  # where check_grammar's errors point

    @property
    def name(self) -> str:
        return self.config.name

    @cached_property
    def validator(self):
        return compile_validator(self.schema)

    @cached_property
    def json_schema(self) -> str | None:
        """The schema model replies are constrained to (canonical text); None for free decoding."""
        return schema_json(self.schema) if self.config.decoding == "constrained" else None

    def check_grammar(self) -> None:
        """Raise ConfigError unless xgrammar compiles the constrained schema and the reply prefix
        starts a message it allows (under free decoding: in any spacing, the schema unchecked).
        Not at load: importing xgrammar imports torch and transformers (seconds) for runs with no
        model; `rolecast validate` and binding the role to the model do."""
        try:
            if self.json_schema is None:
                check_free_reply_prefix(schema_json(self.schema), self.config.reply_prefix)
            else:
                check_reply_prefix(self.json_schema, self.config.reply_prefix)
        except GrammarError as exc:
            raise ConfigError(*self.grammar_sites[exc.key],
                              f"{exc}{' (or set decoding: free)' * (self.json_schema is not None)}") from None

    @cached_property
    def schema_text(self) -> str:
        return json.dumps(self.schema, ensure_ascii=False)

    def context(self, task: dict[str, Any], observation: dict[str, Any]) -> dict[str, Any]:
        return {
            "task": task,
            "role": self.name,
            "description": self.config.description,
            "params": self.config.params,
            "schema": self.schema_text,
            **observation,
        }

    @cached_property
    def _static_system(self) -> str | None:
        """The system message, rendered once when it reads only the role's own fields (those of the
        templates it includes too: one reading the task was rendered with none)."""
        env = self.system_template.environment
        if set(_reads(env, env.parse(_system_source(self.config)), "", "system")) <= {"role", "description", "params", "schema"}:
            return self._render(self.system_template, self.context({}, {}), "system").strip()
        return None

    def render(self, context: dict[str, Any]) -> list[dict[str, str]]:
        """The chat messages of a first attempt: system (none where it renders empty: `system: ""`
        for a model whose chat template has no system role), then the rendered prompt."""
        system = self._static_system
        if system is None:
            system = self._render(self.system_template, context, "system").strip()
        return [*([{"role": "system", "content": system}] if system else []),
                {"role": "user", "content": self._render(self.template, context, "prompt").strip()}]

    def render_followup(self, context: dict[str, Any]) -> dict[str, str]:
        """The user message of a conversation role's later turn."""
        return {"role": "user", "content": self._render(self.followup_template, context, "followup").strip()}

    def _render(self, template: jinja2.Template, context: dict[str, Any], key: str) -> str:
        """``template`` rendered. What the load-time check cannot see, a value's field that is not
        there (``{{ h.prise }}``) or a key ``observe()`` left out, raises UndefinedError naming the
        template's file and line and the role: Jinja's own said only "'dict object' has no
        attribute 'prise'"."""
        try:
            return template.render(context)
        except jinja2.UndefinedError as exc:
            # Jinja rewrites the traceback: a template's frame carries its file and line, "<template>"
            # for one written in a YAML key (a system message)
            frames = [(frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(exc.__traceback__)]
            file, line = next(((f, n) for f, n in reversed(frames) if not f.endswith((".py", "<string>"))), ("<template>", None))
            where = key if file == "<template>" else f"{file}:{line}: {key}"
            raise jinja2.UndefinedError(f"{where}: {exc.message} (role {self.name!r})") from exc

    # Pickling (rollout workers get the team this way): compiled templates do not pickle, so they
    # travel as their file names and are compiled again on arrival; cached properties are dropped.
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in _CACHED}
        for key in ("template", "followup_template"):
            state[key] = state[key] and state[key].filename
        state["system_template"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in ("template", "followup_template"):
            if state[key] is not None:
                path = Path(state[key])
                state[key] = _jinja_env(str(path.parent)).get_template(path.name)
        env = _jinja_env(str(Path(state["template_path"]).parent))
        state["system_template"] = env.from_string(_system_source(state["config"]))
        self.__dict__.update(state)


def _system_source(config: RoleConfig) -> str:
    """The system message's template: ``system: null`` is the default one, ``""`` none."""
    return DEFAULT_SYSTEM if config.system is None else config.system


_CACHED = frozenset(k for k, v in vars(RoleSpec).items() if isinstance(v, cached_property))


def library_roles() -> list[str]:
    return sorted(p.stem for p in LIBRARY_DIR.glob("*.yaml"))


def resolve_role_path(ref: str, base_dir: Path) -> Path | None:
    """A library name (``reviewer``) or a path (``./my_role.yaml``) relative to ``base_dir``."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path = base_dir / ref  # is_file first: it is False, where resolve() raised, for a NUL in it
        return path.resolve() if path.is_file() else None
    path = LIBRARY_DIR / f"{ref}.yaml"
    return path if path.is_file() else None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Overrides win; nested mappings merge, except a schema, which is replaced whole."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "output_schema":
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class _PromptEnvironment(jinja2.Environment):
    def getattr(self, obj: Any, attribute: str) -> Any:
        """A message's field before a dict's method: Jinja's own ``plan.items`` gave a Planner's ``items``
        list as ``<built-in method items ...>`` in the prompt (``keys``, ``values``, ``get``, ``update`` too)."""
        if isinstance(obj, Mapping) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)


@lru_cache(maxsize=64)
def _jinja_env(directory: str) -> jinja2.Environment:
    env = _PromptEnvironment(
        loader=jinja2.FileSystemLoader(directory, encoding="utf-8-sig"),  # a BOM (Windows editors) is not prompt text
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    return env


def _tojson(value: Any, indent: int | None = None) -> str:
    """JSON as a prompt carries it: Jinja's own is HTML-safe (a reply's `a < b` became `a \\u003c b`,
    its `'`, `&` and non-ASCII escapes too) and sorts keys; this keeps the text and the order written."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _reads(env: jinja2.Environment, ast: jinja2.nodes.Template, file: str, key: str, line: int | None = None,
           seen: frozenset[str] = frozenset()) -> dict[str, Site]:
    """The top-level names template ``ast`` reads, each at its first use (or at ``line``: a
    template written in a YAML key), with those of the templates it includes; TemplateAssertionError
    for an unknown filter or test, or a template imported without context that reads variables."""
    first: dict[str, int] = {}
    assigned = set()
    for node in ast.find_all(jinja2.nodes.Name):
        if node.ctx == "load":
            first[node.name] = min(node.lineno, first.get(node.name, node.lineno))
        else:
            assigned.add(node.name)
    for node in ast.find_all((jinja2.nodes.Filter, jinja2.nodes.Test)):
        kind, known = ("filter", env.filters) if isinstance(node, jinja2.nodes.Filter) else ("test", env.tests)
        if node.name not in known:  # inside an {% if %}, Jinja leaves this to the first render that takes the branch
            raise jinja2.TemplateAssertionError(f"No {kind} named {node.name!r}.", node.lineno, filename=file)
    try:
        undeclared = jinja2.meta.find_undeclared_variables(ast)
    except jinja2.TemplateSyntaxError as exc:  # an unknown filter, say: introspection names no file
        exc.filename = file
        raise
    reads = {name: (file, line or first.get(name), key) for name in undeclared}
    for node in ast.find_all((jinja2.nodes.Include, jinja2.nodes.Import, jinja2.nodes.FromImport, jinja2.nodes.Extends)):
        try:
            found = _referenced(env, node)
        except jinja2.TemplateNotFound:  # an OSError too: worded by the caller
            raise
        except (OSError, UnicodeDecodeError) as exc:  # there, but unreadable or not UTF-8: named at the include
            raise ConfigError(file, line or node.lineno, key, f"cannot read the template it includes: {exc}") from None
        if found is None or found[0] in seen:  # nothing to follow, or a template already followed
            continue
        name, source, filename = found
        included = _reads(env, env.parse(source, name, filename), filename, key, seen=seen | {name})
        if not getattr(node, "with_context", True) and (blind := sorted(set(included) - set(env.globals))):
            # an import (by default) or `include ... without context` sees only the globals: a render would fail
            tag, done = ("include", "included") if isinstance(node, jinja2.nodes.Include) else ("import", "imported")
            raise jinja2.TemplateAssertionError(f"{name!r}, {done} without context, cannot read {', '.join(blind)}: "
                                                f"add `with context` to the {tag}", node.lineno, filename=file)
        # an included template also sees the includer's own variables ({% set %}, loop variables)
        reads = {**{n: site for n, site in included.items() if n not in assigned}, **reads}
    return reads


def _referenced(env: jinja2.Environment, node: jinja2.nodes.Node) -> tuple[str, str, str] | None:
    """The template an include (import, extends) renders, as its name, source and file: the first
    of its list that exists, as Jinja picks; None for a name computed at render time or an
    `ignore missing` include of none; TemplateNotFound where none exists."""
    targets = node.template.items if isinstance(node.template, (jinja2.nodes.List, jinja2.nodes.Tuple)) else [node.template]
    if not all(isinstance(t, jinja2.nodes.Const) for t in targets):
        return None
    for target in targets:
        try:
            return (target.value, *env.loader.get_source(env, target.value)[:2])
        except jinja2.TemplateNotFound:
            continue
    if getattr(node, "ignore_missing", False):
        return None
    raise jinja2.TemplateNotFound(" or ".join(str(t.value) for t in targets))


def _compile_template(path: Path, where: tuple[YamlDoc, Loc]) -> tuple[jinja2.Template, dict[str, Site]]:
    doc, loc = where
    key = str(loc[-1])  # prompt or followup
    if not path.is_file():
        raise doc.error(loc, f"prompt template not found: {path}")
    env = _jinja_env(str(path.parent))
    try:
        source = path.read_text(encoding="utf-8-sig")
        variables = _reads(env, env.parse(source, path.name, str(path)), str(path), key)
        template = env.get_template(path.name)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(exc.filename or path, exc.lineno, key, f"template syntax error: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise ConfigError(path, None, key, f"included template not found: {exc.name}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise doc.error(loc, f"cannot read prompt template {path}: {exc}") from None
    return template, variables


def _load_schema(value: dict[str, Any] | str, doc: YamlDoc, loc: Loc) -> dict[str, Any]:
    if isinstance(value, str):
        path = doc.file(loc, value)
        try:
            schema = json.loads(read_text(path, MAX_YAML_BYTES), object_pairs_hook=json_object)
        except ConfigError as exc:  # missing, unreadable or too large
            missing = exc.problem == "file not found"
            raise doc.error(loc, f"schema file not found: {path}" if missing else f"cannot read schema file {path}: {exc.problem}") from None
        except ValueError as exc:
            raise doc.error(loc, f"cannot read schema file {path}: {exc}") from None
        except RecursionError:
            raise doc.error(loc, f"schema file {path} is nested too deeply") from None
    else:
        schema = value
    if not isinstance(schema, dict):
        raise doc.error(loc, "output_schema must be a JSON Schema object")
    if schema is value and (found := not_json(schema)):  # a YAML date in an enum: the checks below raised TypeError
        raise doc.error(loc + found[0], found[1])
    problem = check_schema(schema)
    if problem:
        raise doc.error(loc, problem)
    if schema.get("type") != "object":
        raise doc.error(loc, 'output_schema must describe a JSON object ("type": "object")')
    return schema


def load_role(
    path: str | Path,
    overrides: dict[str, Any] | None = None,
    override_doc: YamlDoc | None = None,
    override_loc: Loc = (),
    registry: Registry | None = None,
) -> RoleSpec:
    """Load a role file, applying ``overrides`` (from a team file) on top.

    Errors point at the file a bad key came from: the role file, or the team file for overrides.
    """
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise doc.error((), "a role file must be a mapping of keys")
    if TEAM_KEYS & set(doc.data):  # not a role missing its description: the `use:` naming it is wrong
        site, loc = (override_doc, override_loc + ("use",)) if override_doc is not None else (doc, ())
        raise site.error(loc, f"{doc.path} is a team file ({', '.join(sorted(TEAM_KEYS & set(doc.data)))}), "
                              f"not a role file")
    overrides = overrides or {}
    merged = deep_merge(doc.data, overrides)

    def where(loc: Loc) -> tuple[YamlDoc, Loc]:
        # The team's file where it set the key or a value holding it; mappings merge, so a key
        # beside those a team's `policy: {adapter: x}` sets is still the role file's.
        node: Any = overrides
        for part in loc:
            if not isinstance(node, dict):
                break
            if part not in node:
                return doc, tuple(loc)
            node = node[part]
        if override_doc is not None and loc:
            return override_doc, override_loc + tuple(loc)
        return doc, tuple(loc)

    try:
        config = RoleConfig.model_validate(merged)
    except ValidationError as exc:
        at, problem = first_error(exc, merged, RoleConfig)
        d, loc = where(at)
        raise d.error(loc, problem) from None

    d, loc = where(("output_schema",))
    schema = _load_schema(config.output_schema, d, loc)
    grammar_sites: dict[str, Site] = {}
    if config.decoding == "constrained":
        try:
            check_enforceable(schema)
        except GrammarError as exc:
            raise d.error(loc, f"{exc} (or set decoding: free)") from None
    for key in ("output_schema", "reply_prefix"):
        key_doc, key_loc = where((key,))
        at = key_doc.error(key_loc, "")
        grammar_sites[key] = (at.file, at.line, at.key)
    d, loc = where(("prompt",))
    template_path = d.file(loc, config.prompt)
    template, variables = _compile_template(template_path, (d, loc))
    followup_template = None
    if config.followup is not None:
        d, loc = where(("followup",))
        followup_template, followup_variables = _compile_template(d.file(loc, config.followup), (d, loc))
        variables = {**followup_variables, **variables}
    env = _jinja_env(str(template_path.parent))
    d, loc = where(("system",))
    try:
        system_template = env.from_string(_system_source(config))
        at = d.error(loc, "")  # the file, line and key an error at `system` names
        variables = {**_reads(env, env.parse(_system_source(config)), at.file, at.key, at.line), **variables}
    except jinja2.TemplateSyntaxError as exc:
        raise d.error(loc, f"template syntax error: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise d.error(loc, f"included template not found: {exc.name}") from None
    binding = None
    if config.policy.bind is not None:
        d, loc = where(("policy", "bind"))
        try:
            binding = parse_binding(config.policy.bind, base_dir=d.path.parent)
            binding.check(registry or default_registry())
        except ValueError as exc:
            raise d.error(loc, str(exc)) from None
    return RoleSpec(
        binding=binding,
        config=config,
        source=doc.path,
        template=template,
        template_path=template_path,
        system_template=system_template,
        schema=schema,
        variables=variables,
        followup_template=followup_template,
        grammar_sites=grammar_sites,
    )
