"""The hooks a rolecast plugin may implement.

Each ``register_*`` hook but ``register_commands`` hands the plugin a ``register`` callback (the
simonw/llm style)::

    from orchestrator.hookspecs import hookimpl

    @hookimpl
    def register_envs(register):
        register("my-game", MyGameEnv)

and the plugin module is listed under the ``rolecast.plugins`` entry-point group.
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("rolecast")
hookimpl = pluggy.HookimplMarker("rolecast")


@hookspec
def register_envs(register):
    """Register environments and team protocols: ``register(name, EnvClass)``."""


@hookspec
def register_policies(register):
    """Register built-in policies for ``builtin:NAME`` bindings: ``register(name, factory)``."""


@hookspec
def register_rewards(register):
    """Register reward functions: ``register(name, reward)``.

    ``reward(episode, roles, config) -> {role: reward}``. Its options are a ``Config`` attribute,
    a subclass of ``orchestrator.config.PluginConfig``; ``config`` is the recipe's
    ``reward_config`` validated against it. A reward without a ``Config`` takes no options. It is
    called on the episodes that finished, not on one that errored or timed out.
    """


@hookspec
def register_trainers(register):
    """Register trainer algorithms: ``register(name, trainer_class)``.

    The class subclasses ``orchestrator.training.trainer.Trainer``; its ``Config`` (a
    ``PluginConfig`` subclass) validates the recipe's ``trainer_config``, read as ``self.config``.
    """


@hookspec
def register_commands(subparsers):
    """Add ``rolecast`` commands: ``p = subparsers.add_parser(NAME, help=...)`` (argparse), add its
    arguments, then ``p.set_defaults(func=handler)``; ``handler(args)`` returns the exit code.
    A ``RolecastError`` it raises is one line on stderr and exit code 2, as for built-in commands.
    """
