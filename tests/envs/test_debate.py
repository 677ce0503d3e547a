"""Debate with a judge: configured rewards, hand-computed."""
from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.team import load_team
from play import ROOT, Script, play, team


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


def test_the_judge_sees_letters_in_a_random_order_and_a_letter_names_its_side(tmp_path):
    """A position-biased judge that always answers "A" must not hand one debater every win: the
    sides are lettered in a per-episode random order, and no stance word reaches the judge."""
    judge = Script(*[{"winner": "A", "reason": "r"}] * 40)
    policies = {"pro": Script(*[{"argument": "pro says"}] * 2), "con": Script(*[{"argument": "con says"}] * 2),
                "judge": judge}
    episodes = play(team("debate", tasks=[{"topic": "t"}]), policies, tmp_path, episodes=40).episodes
    assert len(episodes) == 40 and len(judge.requests) == 40
    for ep, request in zip(episodes, sorted(judge.requests, key=lambda r: r.episode)):
        prompt = request.messages[-1]["content"]
        a_side = "pro" if "[A] pro says" in prompt else "con"
        assert f"[B] {'con' if a_side == 'pro' else 'pro'} says" in prompt
        assert "[for]" not in prompt and "[against]" not in prompt
        assert ep.outcome["winner"] == a_side
    wins = sum(ep.outcome["winner"] == "pro" for ep in episodes)
    assert 10 <= wins <= 30  # about half: the letter, not the side, carries the bias


def test_the_judge_reward_credits_the_side_a_letter_names(tmp_path):
    """``reward: judge`` on a debate: the judge answers with a side's letter, which named no role,
    so every debater got 0 and nothing learnt."""
    from orchestrator.registry import default_registry

    judge_reward = default_registry().get("rewards", "judge")
    policies = {"pro": Script(*[{"argument": "p"}] * 16), "con": Script(*[{"argument": "c"}] * 16),
                "judge": Script(*[{"winner": "A", "reason": "r"}] * 8)}
    episodes = play(team("debate", tasks=[{"topic": "t"}]), policies, tmp_path, episodes=8).episodes
    assert {ep.outcome["winner"] for ep in episodes} == {"pro", "con"}
    for ep in episodes:
        assert judge_reward(ep, ["pro", "con", "judge"], judge_reward.Config()) == ep.rewards


def test_a_letter_names_the_side_it_labels_when_the_debaters_are_called_by_letters(tmp_path):
    """Debaters named a and b: the judge's "A" is the side its prompt lettered A, not role a."""
    text = (ROOT / "recipes" / "debate.yaml").read_text()
    for old, new in (("[pro, con]", "[a, b]"), ("name: pro", "name: a"), ("name: con", "name: b")):
        text = text.replace(old, new)
    (tmp_path / "ab.yaml").write_text(text)
    judge = Script({"winner": "A", "reason": "r"})
    policies = {"a": Script({"argument": "a says"}, {"argument": "a again"}),
                "b": Script({"argument": "b says"}, {"argument": "b again"}), "judge": judge}
    episodes = play(load_team(tmp_path / "ab.yaml"), policies, tmp_path, episodes=8).episodes
    lettered_a = {r.episode: "a" if "[A] a says" in r.messages[-1]["content"] else "b" for r in judge.requests}
    assert set(lettered_a.values()) == {"a", "b"}
    assert all(ep.outcome["winner"] == lettered_a[ep.id] for ep in episodes)


def test_a_task_given_as_text_is_the_topic(tmp_path):
    """``rolecast run recipes/debate.yaml --task TOPIC`` (and ``rolecast.run(tasks=[...])``) debates it."""
    import rolecast

    pro = Script({"argument": "a"}, {"argument": "b"})
    policies = {"pro": pro, "con": Script({"argument": "c"}, {"argument": "d"}), "judge": Script({"winner": "A", "reason": "r"})}
    rolecast.run(ROOT / "recipes/debate.yaml", tasks=["Zoos should be closed."], episodes=1, policies=policies,
                 out=tmp_path / "run", progress=False)
    assert pro.requests[0].messages[-1]["content"].startswith("Debate topic: Zoos should be closed.")


def test_more_rounds_than_max_turns_allows_are_refused_at_load(tmp_path):
    """2 rounds and the verdict are 5 turns: under max_turns 4 every episode stopped before the
    judge, with no winner and no reward."""
    path = tmp_path / "debate.yaml"
    path.write_text((ROOT / "recipes" / "debate.yaml").read_text() + "max_turns: 4\n")
    with pytest.raises(ConfigError, match="a whole game can take 5 turns and max_turns is 4"):
        load_team(path)
    path.write_text((ROOT / "recipes" / "debate.yaml").read_text() + "max_turns: 5\n")
    assert load_team(path).config.max_turns == 5
