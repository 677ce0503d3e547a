"""rolecast's own built-ins, registered through its own ``rolecast.plugins`` entry point."""
from __future__ import annotations

from orchestrator.hookspecs import hookimpl
from orchestrator.policies.stub import StubPolicy
from orchestrator.protocols.debate import DebateEnv
from orchestrator.protocols.pipeline import PipelineEnv


@hookimpl
def register_envs(register):
    register("pipeline", PipelineEnv)
    register("debate", DebateEnv)


@hookimpl
def register_policies(register):
    register("stub", StubPolicy)
