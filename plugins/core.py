"""rolecast's own built-ins, registered through its own ``rolecast.plugins`` entry point."""
from __future__ import annotations

from orchestrator.envs.code_pair import CodePairEnv
from orchestrator.envs.debate import DebateEnv
from orchestrator.envs.generate_judge import GenerateJudgeEnv
from orchestrator.envs.pipeline import PipelineEnv
from orchestrator.envs.propose_solve import ProposeSolveEnv
from orchestrator.envs.teacher_student import TeacherStudentEnv
from orchestrator.hookspecs import hookimpl
from orchestrator.issue_fix.env import IssueFixEnv
from orchestrator.policies.stub import StubPolicy

from .rewards import REWARDS
from .trainers.freeze_rotate import FreezeRotate
from .trainers.grpo import GRPO
from .trainers.mgrpo import MGRPO
from .trainers.population import Population
from .trainers.self_play import SelfPlay


@hookimpl
def register_envs(register):
    register("pipeline", PipelineEnv)
    register("debate", DebateEnv)
    register("issue_fix", IssueFixEnv)
    register("code_pair", CodePairEnv)
    register("propose_solve", ProposeSolveEnv)
    register("teacher_student", TeacherStudentEnv)
    register("generate_judge", GenerateJudgeEnv)


@hookimpl
def register_policies(register):
    register("stub", StubPolicy)


@hookimpl
def register_rewards(register):
    for name, fn in REWARDS.items():
        register(name, fn)


@hookimpl
def register_trainers(register):
    register("grpo", GRPO)
    register("freeze-rotate", FreezeRotate)
    register("m-grpo", MGRPO)
    register("self-play", SelfPlay)
    register("population", Population)
