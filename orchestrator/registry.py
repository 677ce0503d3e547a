"""Discovers plugins through the ``rolecast.plugins`` entry points and keeps what they register.

A plugin that fails to import, leaves a hook unmarked, or whose hook raises (its commands' hook included), is recorded
with its error and skipped whole (none of its names or commands is kept, even those registered
before the failure): one broken plugin never takes the CLI down, nor half-loads. So is one that
registers what breaks the contract: an env that is not an ``Env`` subclass, a policy that cannot
be called, a reward that does not take ``(episode, roles, config)``, a trainer that is not a
``Trainer`` subclass or leaves a hook abstract, an env whose ``step`` or ``close`` is not
``async def`` or whose ``Task`` is no pydantic model, an env, trainer or reward whose ``Config``
lets unknown keys through.
"""
from __future__ import annotations

import difflib
import importlib.metadata
import inspect
from dataclasses import dataclass, field
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import pluggy
from pydantic import BaseModel

from . import hookspecs
from .config import PluginConfig
from .errors import one_line
from .training.trainer import Trainer

ENTRY_POINT_GROUP = "rolecast.plugins"
KINDS = ("envs", "policies", "rewards", "trainers")
HOOKS = tuple(f"register_{kind}" for kind in (*KINDS, "commands"))
SINGULAR = {"envs": "env", "policies": "policy", "rewards": "reward", "trainers": "trainer"}
ENV_PARTS = ("Config", "Task", "next_role", "observe", "step")


@dataclass(frozen=True)
class Registration:
    kind: str
    name: str
    obj: Any
    plugin: str  # entry-point name
    source: str  # "dist==version (module)"


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    source: str
    error: str


@dataclass
class Registry:
    items: dict[str, dict[str, Registration]] = field(default_factory=lambda: {k: {} for k in KINDS})
    failures: list[PluginFailure] = field(default_factory=list)
    plugins: list[tuple[str, str]] = field(default_factory=list)  # (name, source) loaded fine
    commands: list[tuple[str, str, Callable[..., Any]]] = field(default_factory=list)  # (plugin, source, hook)
    command_names: list[Registration] = field(default_factory=list)  # what add_commands added, for `rolecast plugins`

    def get(self, kind: str, name: str) -> Any:
        try:
            return self.items[kind][name].obj
        except KeyError:
            known = ", ".join(sorted(self.items[kind])) or "none"
            # the name may be a broken plugin's: "unknown" alone sends its author to check the install
            failed = "".join(f"; plugin {f.plugin} failed to load: {f.error}" for f in self.failures)
            raise KeyError(f"unknown {SINGULAR[kind]} plugin {name!r} (known: {known}){failed}") from None

    def names(self, kind: str) -> list[str]:
        return sorted(self.items[kind])

    def add_module(self, module: Any, plugin: str, source: str) -> None:
        """Register one plugin module: call each of its hooks with a ``register`` callback."""
        pm = pluggy.PluginManager("rolecast")
        pm.add_hookspecs(hookspecs)
        try:
            pm.register(module, name=plugin)
            pm.check_pending()  # a hookimpl whose name matches no hookspec (a misspelt hook)
        except Exception as exc:
            self.failures.append(PluginFailure(plugin, source, one_line(exc)))
            return
        # pluggy skips a hook function without the marker: the plugin would load and register nothing
        if unmarked := [h for h in HOOKS if callable(getattr(module, h, None)) and not getattr(pm.hook, h).get_hookimpls()]:
            self.failures.append(PluginFailure(plugin, source, f"{unmarked[0]} is not marked @hookimpl "
                                               "(from orchestrator.hookspecs import hookimpl)"))
            return
        staged: dict[str, dict[str, Registration]] = {k: {} for k in KINDS}
        errors = []
        for kind in KINDS:
            for impl in getattr(pm.hook, f"register_{kind}").get_hookimpls():
                try:
                    impl.function(register=self._registrar(kind, plugin, source, staged[kind]))
                except Exception as exc:
                    errors.append(PluginFailure(plugin, source, f"register_{kind}: {one_line(exc)}"))
        if errors:
            self.failures += errors
            return
        self._drop(plugin)  # registering again: what it registered before goes, what it registers now stays
        for kind in KINDS:
            self.items[kind].update(staged[kind])
        self.commands += [(plugin, source, impl.function) for impl in pm.hook.register_commands.get_hookimpls()]
        self.plugins.append((plugin, source))

    def add_commands(self, subparsers: Any) -> None:
        """Let each plugin add its CLI commands; one that fails is recorded, not raised."""
        self.command_names.clear()  # a parser built again (in tests, say) gets every command again
        for plugin, source, hook in list(self.commands):  # _drop shrinks the list: iterating it would skip the next
            before = set(subparsers.choices)
            try:
                hook(subparsers=subparsers)
            except Exception as exc:  # argparse refuses a command name that is taken, say
                self.failures.append(PluginFailure(plugin, source, f"register_commands: {one_line(exc)}"))
                self._drop(plugin)
                continue
            self.command_names += [Registration("commands", name, parser, plugin, source)
                                   for name, parser in subparsers.choices.items() if name not in before]

    def _drop(self, plugin: str) -> None:
        """Forget what ``plugin`` registered: its names, its commands, its place among those loaded."""
        for kind in KINDS:
            self.items[kind] = {n: r for n, r in self.items[kind].items() if r.plugin != plugin}
        self.commands[:] = [c for c in self.commands if c[0] != plugin]
        self.command_names[:] = [c for c in self.command_names if c.plugin != plugin]
        self.plugins[:] = [p for p in self.plugins if p[0] != plugin]

    def _registrar(self, kind: str, plugin: str, source: str, staged: dict[str, Registration]):
        """``register(name, obj)`` for one plugin's hook: names go to ``staged`` until all its hooks succeed."""
        def register(name: str, obj: Any) -> None:
            if not isinstance(name, str) or not name:
                raise ValueError(f"{SINGULAR[kind]} plugin name must be a non-empty string, got {name!r}")
            _check_plugin(kind, obj)
            if name in staged:  # the plugin's own copy-paste slip: the first object would be lost
                raise ValueError(f"{SINGULAR[kind]} {name!r} is registered twice")
            taken = self.items[kind].get(name)
            if taken is not None and taken.plugin != plugin:
                raise ValueError(f"{SINGULAR[kind]} {name!r} is already registered by plugin {taken.plugin!r}")
            staged[name] = Registration(kind, name, obj, plugin, source)

        return register


def config_model(plugin: Any) -> type[BaseModel]:
    """The options model of a trainer or reward: its ``Config``; ``PluginConfig`` (no options) without one."""
    return getattr(plugin, "Config", PluginConfig)


def _check_plugin(kind: str, obj: Any) -> None:
    # Checked at registration, so a plugin that breaks the contract shows in `rolecast plugins`
    # rather than as a crash in the middle of a training run.
    what = getattr(obj, "__qualname__", repr(obj))
    # envs by what an Env has: importing envs.base here would close an import cycle (base -> role -> registry)
    if kind == "envs" and not (isinstance(obj, type) and all(hasattr(obj, a) for a in ENV_PARTS)):
        raise TypeError(f"{what} is not an env (a subclass of orchestrator.envs.base.Env)")
    if kind == "policies" and not callable(obj):
        raise TypeError(f"{what} cannot be called: a policy plugin is a class or function taking the role's spec")
    if kind == "rewards" and not _takes(obj, 3):
        raise TypeError(f"{what} must be a function of (episode, roles, config)")
    if kind == "trainers" and not (isinstance(obj, type) and issubclass(obj, Trainer)):
        raise TypeError(f"{what} is not a subclass of orchestrator.training.trainer.Trainer")
    if kind in ("envs", "trainers") and inspect.isabstract(obj):
        raise TypeError(f"{what} does not implement {', '.join(sorted(obj.__abstractmethods__))}")
    # the episode awaits them: a plain `def step` failed every episode with "object StepResult
    # can't be used in 'await' expression"
    if kind == "envs" and (sync := [m for m in ("step", "close") if not inspect.iscoroutinefunction(getattr(obj, m, None))]):
        raise TypeError(f"{what}.{sync[0]} must be `async def` (the episode awaits it)")
    if kind in ("envs", "trainers", "rewards"):  # else a misspelt protocol key or option is dropped without a word
        config = config_model(obj)
        if not (isinstance(config, type) and issubclass(config, BaseModel)) or config.model_config.get("extra") != "forbid":
            base = "orchestrator.envs.EnvConfig" if kind == "envs" else "orchestrator.config.PluginConfig"
            raise TypeError(f"{what}.Config must be a pydantic model that forbids unknown keys (subclass {base})")
    # every task is validated against it when a team loads: a dict there was a traceback from validate
    if kind == "envs" and not (isinstance(obj.Task, type) and issubclass(obj.Task, BaseModel)):
        raise TypeError(f"{what}.Task must be a pydantic model (subclass orchestrator.envs.base.TaskConfig)")


def _takes(fn: Any, n: int) -> bool:
    """Whether ``fn`` can be called with ``n`` positional arguments."""
    try:
        inspect.signature(fn).bind(*[None] * n)
    except (TypeError, ValueError):  # not callable, another arity, or no signature to read
        return False
    return True


def _source(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f"{dist.name}=={dist.version}" if dist is not None else "?"
    return f"{where} ({ep.value})"


def _dist_name(ep: importlib.metadata.EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else None


def _builtin(ep: importlib.metadata.EntryPoint) -> bool:
    dist = getattr(ep, "dist", None)
    return dist is not None and dist.name == "rolecast"


def discover() -> Registry:
    registry = Registry()
    # rolecast's own plugins first (core before games), then the others by name: a third-party
    # plugin that takes a built-in name (policy `random`, say) is the one that fails
    eps = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                 key=lambda e: (not _builtin(e), e.name != "core", e.name))
    seen: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in eps:
        if (first := seen.setdefault(ep.name, ep)) is not ep:
            if _dist_name(first) != _dist_name(ep):  # not the same distribution found twice on sys.path
                registry.failures.append(PluginFailure(ep.name, _source(ep), f"the plugin name {ep.name!r} is "
                                                       f"taken by {_source(first)}: rename its entry point"))
            continue
        try:
            module = ep.load()
        except Exception as exc:
            registry.failures.append(PluginFailure(ep.name, _source(ep), one_line(exc)))
            continue
        registry.add_module(module, ep.name, _source(ep))
    for ep in _misplaced():
        registry.failures.append(PluginFailure(ep.name, _source(ep), f"its entry point is in group {ep.group!r}, "
                                               f"which rolecast does not read: the group is {ENTRY_POINT_GROUP!r}"))
    return registry


def _misplaced() -> list[importlib.metadata.EntryPoint]:
    """Entry points in a group named like rolecast's but not it (``rolecast.plugin``): never loaded,
    their plugin's envs and trainers were only "unknown", as if it were not installed."""
    found = {(ep.group, ep.name, ep.value): ep for dist in importlib.metadata.distributions() for ep in dist.entry_points
             if ep.group != ENTRY_POINT_GROUP
             and difflib.SequenceMatcher(None, ep.group.lower(), ENTRY_POINT_GROUP).ratio() >= 0.8}
    return list(found.values())


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    return discover()
