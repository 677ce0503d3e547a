"""propose_solve: the Solver earns the share it solved, the Proposer 4 p (1 - p)."""
from __future__ import annotations

import pytest
from play import ROOT, Script, another_shape, play, team

from orchestrator.errors import ConfigError
from orchestrator.team import load_team


@pytest.mark.parametrize("answers, solver, proposer", [
    ([444, 444, 444, 444], 1.0, 0.0),      # always solved: too easy
    ([444, 1, 444, 2], 0.5, 1.0),          # half: the edge of the Solver's ability
    ([444, 0, 0, 0], 0.25, 0.75),
    ([0, 0, 0, 0], 0.0, 0.0),              # never solved: too hard
])
def test_rewards_follow_the_solved_share(tmp_path, answers, solver, proposer):
    solver_script = Script(*({"answer": a} for a in answers))
    (ep,) = play(team("propose_solve"), {"proposer": Script({"a": 37, "op": "*", "b": 12}), "solver": solver_script},
                 tmp_path).episodes
    assert [t.role for t in ep.turns] == ["proposer"] + ["solver"] * 4
    assert ep.rewards == {"solver": solver, "proposer": pytest.approx(proposer)}
    assert ep.outcome["answer"] == 444 and ep.outcome["answers"] == answers
    prompts = [r.messages[-1]["content"] for r in solver_script.requests]
    assert len(prompts) == 4 and all("37 * 12" in p for p in prompts)  # each try sees only the problem


def test_a_problem_outside_the_rules_ends_the_episode(tmp_path):
    t = team("propose_solve", max_operand=10)
    proposer = Script({"a": 37, "op": "+", "b": 1})  # 37 > max_operand
    (ep,) = play(t, {"proposer": proposer, "solver": Script({"answer": 38})}, tmp_path).episodes
    assert [turn.role for turn in ep.turns] == ["proposer"] and ep.outcome["reason"] == "illegal problem"
    # below the 0 of a problem always solved: posing out of bounds must not pay as well
    assert ep.rewards == {"proposer": -1.0, "solver": 0.0}


def test_outcome_metrics_show_a_proposer_that_repeats_itself():
    from orchestrator.envs.propose_solve import ProposeSolveEnv

    nine, other = {"a": 9, "op": "+", "b": 9}, {"a": 1, "op": "*", "b": 2}
    outcomes = [{"problem": nine}, {"problem": dict(reversed(nine.items()))}, {"problem": nine}, {"problem": other},
                {"problem": None}]  # an invalid proposal posed nothing
    t = team("propose_solve")
    assert ProposeSolveEnv.outcome_metrics(t.env_config, outcomes) == {"distinct_problems": 0.5, "commonest_problem": 0.75}
    assert ProposeSolveEnv.outcome_metrics(t.env_config, [{"problem": None}]) == {}


def test_more_attempts_than_max_turns_allows_are_refused_at_load(tmp_path):
    """The proposal and 4 tries are 5 turns: under max_turns 4 every episode stopped before the
    last try, with no reward for either role."""
    path = tmp_path / "ps.yaml"
    path.write_text((ROOT / "recipes" / "propose_solve.yaml").read_text() + "max_turns: 4\n")
    with pytest.raises(ConfigError, match="a whole game can take 5 turns and max_turns is 4"):
        load_team(path)


@pytest.mark.parametrize("problem, answer", [({"a": 50, "op": "-", "b": 8}, 42), ({"a": 5, "op": "+", "b": 8}, 13)])
def test_each_op_has_its_answer_and_each_try_its_number(tmp_path, problem, answer):
    solver = Script(*[{"answer": answer}] * 3, {"answer": 0})
    (ep,) = play(team("propose_solve"), {"proposer": Script(problem), "solver": solver}, tmp_path).episodes
    assert ep.outcome["answer"] == answer and ep.outcome["solved"] == 0.75 and ep.outcome["reason"] == "solved"
    assert ep.rewards == {"solver": 0.75, "proposer": pytest.approx(0.75)}
    assert [r.context["attempt"] for r in solver.requests] == [1, 2, 3, 4]
    (ep,) = play(team("propose_solve"), {"proposer": Script(problem), "solver": Script(*[{"answer": 0}] * 4)},
                 tmp_path).episodes
    assert ep.outcome["solved"] == 0.0 and ep.outcome["reason"] == "unsolved"


def test_an_invalid_proposal_ends_the_episode_with_its_penalty_alone(tmp_path):
    (ep,) = play(team("propose_solve"), {"proposer": Script("x", "x"), "solver": Script()}, tmp_path).episodes
    assert [turn.role for turn in ep.turns] == ["proposer"] and ep.outcome["reason"] == "no valid problem"
    assert ep.rewards == {"proposer": -0.5, "solver": 0.0}


@pytest.mark.parametrize("problem, legal", [
    ({"a": 10, "op": "*", "b": 1}, True), ({"a": 0, "op": "+", "b": 2}, True), ({"a": 11, "op": "*", "b": 1}, False), ({"a": -1, "op": "+", "b": 2}, False),
    ({"a": True, "op": "+", "b": 2}, False), ({"a": 1, "op": "/", "b": 2}, False)])
def test_the_environment_keeps_the_rules_the_schema_may_not(tmp_path, problem, legal):
    """max_operand, a whole number from 0 (not a bool), and an op of +, - or *: checked by the
    environment too, for a proposer whose schema allows more."""
    import dataclasses

    t = team("propose_solve", max_operand=10)
    loose = {"type": "object", "properties": {"a": {}, "op": {}, "b": {}}, "required": ["a", "op", "b"]}
    t = dataclasses.replace(t, roles={**t.roles, "proposer": dataclasses.replace(t.roles["proposer"], schema=loose)})
    (ep,) = play(t, {"proposer": Script(problem), "solver": Script(*[{"answer": 0}] * 4)}, tmp_path).episodes
    assert ep.outcome["reason"] == ("unsolved" if legal else "illegal problem")
    assert ep.rewards["proposer"] == (0.0 if legal else -1.0)


def test_the_proposer_and_the_solver_are_different_roles():
    from orchestrator.envs.propose_solve import ProposeSolveConfig

    with pytest.raises(ValueError, match="proposer and solver must be different roles"):
        ProposeSolveConfig(proposer="x", solver="x")


def test_a_true_is_no_answer_of_1(tmp_path):
    """For a solver whose schema allows it: JSON true is not the number 1 (Python's True == 1)."""
    import dataclasses

    t = team("propose_solve")
    loose = {"type": "object", "properties": {"answer": {}}, "required": ["answer"]}
    t = dataclasses.replace(t, roles={**t.roles, "solver": dataclasses.replace(t.roles["solver"], schema=loose)})
    solver = Script(*[{"answer": True}] * 2, *[{"answer": 1}] * 2)
    (ep,) = play(t, {"proposer": Script({"a": 1, "op": "*", "b": 1}), "solver": solver}, tmp_path).episodes
    assert ep.outcome["answers"] == [None, None, 1, 1] and ep.rewards["solver"] == 0.5


@pytest.mark.parametrize("role, other, fields", [("proposer", "solver", "a, b, op"), ("solver", "proposer", "answer")])
def test_roles_of_another_shape_are_refused_at_load(tmp_path, role, other, fields):
    """A proposer answering {"answer": 444} loaded, then posed an illegal problem every episode."""
    with pytest.raises(ConfigError, match=rf"ProposeSolveEnv reads field\(s\) {fields} of the messages of role '{role}'"):
        load_team(another_shape(tmp_path, "propose_solve", role, other))
