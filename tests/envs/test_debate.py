"""Debate with a judge: configured rewards, hand-computed."""
from __future__ import annotations

import pytest

from play import Script, play, team


def debate(winner: str) -> dict:
    return {"pro": Script({"argument": "a"}, {"argument": "b"}), "con": Script({"argument": "c"}, {"argument": "d"}),
            "judge": Script({"winner": winner, "reason": "r"})}


@pytest.mark.parametrize("winner,expected", [
    ("against", {"pro": -1.0, "con": 2.0}),   # a stance names its debater
    ("pro", {"pro": 2.0, "con": -1.0}),       # so does a role name
    ("nobody", {"pro": 0.25, "con": 0.25}),   # an unknown side is a tie
])
def test_configured_rewards(tmp_path, winner, expected):
    t = team("debate", tasks=[{"topic": "t"}], rewards={"winner": 2.0, "loser": -1.0, "tie": 0.25})
    (ep,) = play(t, debate(winner), tmp_path).episodes
    assert ep.rewards == {**expected, "judge": 0.0}
