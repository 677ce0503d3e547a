"""Debate with a judge: configured rewards, hand-computed."""
from __future__ import annotations

import dataclasses

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
    (" Pro ", {"pro": 2.0, "con": -1.0}),     # in any case, spaced
    ("nobody", {"pro": 0.25, "con": 0.25}),   # an unknown side is a tie
])
def test_configured_rewards(tmp_path, winner, expected):
    t = team("debate", tasks=[{"topic": "t"}], rewards={"winner": 2.0, "loser": -1.0, "tie": 0.25})
    (ep,) = play(t, debate(winner), tmp_path).episodes
    assert ep.rewards == {**expected, "judge": 0.0}


def test_a_stance_written_in_capitals_is_named_in_any_case(tmp_path):
    (tmp_path / "d.yaml").write_text((ROOT / "recipes" / "debate.yaml").read_text().replace("stance: against", "stance: Against"))
    t = dataclasses.replace(load_team(tmp_path / "d.yaml"), tasks=[{"topic": "t"}])
    (ep,) = play(t, debate("against"), tmp_path).episodes
    assert ep.outcome["winner"] == "con" and ep.rewards == {"pro": -0.5, "con": 1.0, "judge": 0.0}


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


def test_an_invalid_verdict_is_a_tie_whatever_it_names(tmp_path):
    # {"winner": "pro"} lacks the schema's reason: invalid after its retries, it names no winner
    t = team("debate", tasks=[{"topic": "t"}], rewards={"winner": 2.0, "loser": -1.0, "tie": 0.25})
    (ep,) = play(t, {**debate("pro"), "judge": Script(*[{"winner": "pro"}] * 3)}, tmp_path).episodes
    assert ep.outcome["winner"] is None and (ep.rewards["pro"], ep.rewards["con"]) == (0.25, 0.25)


def test_the_judge_reads_the_last_round_as_its_round(tmp_path):
    judge = Script({"winner": "A", "reason": "r"})
    play(team("debate", tasks=[{"topic": "t"}]), {**debate("A"), "judge": judge}, tmp_path)
    assert (judge.requests[0].context["round"], judge.requests[0].context["rounds"]) == (2, 2)


@pytest.mark.parametrize("first, openers", [("fixed", {"pro"}), ("random", {"pro", "con"})])
def test_who_opens(tmp_path, first, openers):
    policies = {"pro": Script(*[{"argument": "p"}] * 40), "con": Script(*[{"argument": "c"}] * 40),
                "judge": Script(*[{"winner": "A", "reason": "r"}] * 20)}
    episodes = play(team("debate", tasks=[{"topic": "t"}], first=first), policies, tmp_path, episodes=20).episodes
    assert {ep.turns[0].role for ep in episodes} == {ep.outcome["first"] for ep in episodes} == openers


def test_on_invalid_end_stops_the_debate_at_an_invalid_argument(tmp_path):
    t = team("debate", tasks=[{"topic": "t"}], first="fixed", on_invalid="end")
    (ep,) = play(t, {**debate("pro"), "con": Script("no", "no", "no")}, tmp_path).episodes
    assert [turn.role for turn in ep.turns] == ["pro", "con"] and ep.outcome["winner"] is None
    assert ep.rewards == {"pro": 0.0, "con": -1.0, "judge": 0.0}  # con's invalid_penalty only


def test_the_debaters_and_the_judge_are_three_roles():
    with pytest.raises(ValueError, match="the two debaters and the judge must be three different roles"):
        team("debate", judge="con")


def test_each_debater_argues_once_a_round_then_the_judge_decides(tmp_path):
    t = team("debate", tasks=[{"topic": "t"}], first="fixed", rounds=3)
    pro, con = Script(*[{"argument": "p"}] * 3), Script(*[{"argument": "c"}] * 3)
    judge = Script({"winner": "A", "reason": "r"})
    (ep,) = play(t, {"pro": pro, "con": con, "judge": judge}, tmp_path).episodes
    assert [turn.role for turn in ep.turns] == ["pro", "con"] * 3 + ["judge"]
    assert [r.context["round"] for r in pro.requests] == [r.context["round"] for r in con.requests] == [1, 2, 3]
    assert len(judge.requests[0].context["arguments"]) == 6


def test_the_judge_reads_the_sides_in_letter_order_and_only_it_sees_letters(tmp_path):
    """The judge's prompt lists the sides in its `debaters` order: in the debaters' order, "A" was
    named second in half the episodes, handing a position-biased judge's pick back to one side."""
    judge = Script(*[{"winner": "A", "reason": "r"}] * 8)
    pro, con = Script(*[{"argument": "p"}] * 16), Script(*[{"argument": "c"}] * 16)
    play(team("debate", tasks=[{"topic": "t"}]), {"pro": pro, "con": con, "judge": judge}, tmp_path, episodes=8)
    assert {tuple(d["role"] for d in r.context["debaters"]) for r in judge.requests} == {("pro", "con"), ("con", "pro")}
    for r in judge.requests:
        assert [d["label"] for d in r.context["debaters"]] == ["A", "B"] and r.context["stance"] is None
    for r in pro.requests + con.requests:
        assert all(a["label"] is None for a in r.context["arguments"])
        assert all(d["label"] is None for d in r.context["debaters"])
        assert r.context["stance"] == ("for" if r in pro.requests else "against")
