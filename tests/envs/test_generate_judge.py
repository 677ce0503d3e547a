"""generate_judge: the Generator is paid for a right answer, the Judge for a verdict that agrees
with the truth, whichever way the answer went."""
from __future__ import annotations

import json
import re

import pytest
from play import Script, play, team


def generator(right: bool):
    def answer(request) -> str:
        a, op, b = re.search(r"Compute (\d+) ([-+*]) (\d+)", request.messages[-1]["content"]).groups()
        value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        return json.dumps({"answer": value if right else value + 1})
    return answer


@pytest.mark.parametrize("right, verdict, rewards", [
    (True, "correct", {"generator": 1.0, "judge": 1.0}),
    (True, "incorrect", {"generator": 1.0, "judge": 0.0}),
    (False, "incorrect", {"generator": 0.0, "judge": 1.0}),
    (False, "correct", {"generator": 0.0, "judge": 0.0}),
])
def test_the_judge_is_paid_for_agreeing_with_the_truth(tmp_path, right, verdict, rewards):
    judge = Script({"verdict": verdict})
    (ep,) = play(team("generate_judge"), {"generator": generator(right), "judge": judge}, tmp_path).episodes
    assert ep.status == "ok", ep.error
    assert [t.role for t in ep.turns] == ["generator", "judge"]
    assert ep.rewards == rewards
    assert ep.outcome["answer_correct"] is right and ep.outcome["verdict"] == verdict
    shown = judge.requests[0].messages[-1]["content"]
    assert f"Proposed answer: {ep.outcome['answer']}" in shown


def test_an_invalid_verdict_earns_nothing_and_problems_vary(tmp_path):
    episodes = play(team("generate_judge"), {"generator": generator(True), "judge": Script(*["maybe"] * 12)},
                    tmp_path, episodes=6).episodes
    assert [ep.rewards["judge"] for ep in episodes] == [-0.5] * 6  # no agreement, and the invalid-turn penalty
    assert all(ep.outcome["verdict"] is None for ep in episodes)
    assert len({json.dumps(ep.outcome["problem"]) for ep in episodes}) > 1
    assert all(0 <= ep.outcome["problem"]["a"] <= 20 for ep in episodes)
