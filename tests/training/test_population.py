"""The population trainer: seating, matchmaking frequencies per rule, ratings and records on
scripted results, per-member advantages, snapshots, and exact state round trips."""
from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import credit, metric_rows, train_tiny

from orchestrator.registry import default_registry
from orchestrator.training.trainer import TrainerContext
from orchestrator.transcript import EpisodeRecord

N_DRAWS = 20000


def make(episodes_per_step=0, **config):
    cls = default_registry().get("trainers", "population")
    return cls(TrainerContext(adapters={"x": "player", "o": "player"}, config=cls.Config(**config),
                              episodes_per_step=episodes_per_step))


def opponents(t, member: str, step: int = 1) -> Counter:
    """Who ``member`` was matched with over many episodes where it is the focal member."""
    n = len(t.members)
    k = t.members.index(member)
    picks = Counter()
    for i in range(k, N_DRAWS * n, n):
        seats = t.match(step, i)
        _, seat = t.focal(i)
        picks.update(a for p, a in seats.items() if p != seat)
    return picks


def test_a_step_of_episodes_no_multiple_of_members_and_seats_rotates_the_seats_over_the_steps():
    """Six episodes a step, four members, two seats: each step had seated members 0 and 1 twice and
    2 and 3 never in the second seat."""
    t = make(members=4, episodes_per_step=6)
    assert t.focal(0, 1) == ("player-0", "x") and t.focal(0, 2) == ("player-2", "o")  # episode 6 of the run
    seen = Counter(t.focal(i, step) for step in range(1, 5) for i in range(6))
    assert seen == Counter({(m, p): 3 for m in t.members for p in ("x", "o")})
    seated = [t.match(step, i) for step in (1, 2) for i in range(6)]
    assert all(s[p] == m for s, (m, p) in zip(seated, [t.focal(i, step) for step in (1, 2) for i in range(6)]))


def test_members_seats_and_learners():
    t = make(members=3)
    assert t.members == t.learners() == ["player-0", "player-1", "player-2"]
    assert make(members=["ann", "bea"]).members == make(members=["ann", "bea", "ann"]).members == ["ann", "bea"]
    # every member plays every seat equally often; the focal member is in its seat, never its own opponent
    seen = Counter()
    for i in range(60):
        member, seat = t.focal(i)
        seats = t.match(1, i)
        assert seats[seat] == member and len(set(seats.values())) == 2
        seen[member, seat] += 1
    assert len(seen) == 6 and set(seen.values()) == {10}


def test_needs_players_sharing_one_adapter():
    cls = default_registry().get("trainers", "population")
    with pytest.raises(ValueError, match="sharing one adapter"):
        cls(TrainerContext(adapters={"x": "px", "o": "po"}))
    with pytest.raises(ValueError, match="sharing one adapter, two or more"):  # was StopIteration in after_step
        cls(TrainerContext(adapters={"x": "player"}))
    with pytest.raises(ValueError, match=r"\['judge'\] learn but are not players"):  # its adapter never trained
        cls(TrainerContext(adapters={"x": "player", "o": "player", "judge": "judge"}, config=cls.Config(players=["x", "o"])))
    with pytest.raises(ValueError, match="two or more distinct members"):
        cls.Config(members=["a", "a"])
    with pytest.raises(ValueError, match="'../b' is not an adapter name"):  # was a KeyError out of PEFT mid-run
        cls.Config(members=["a", "../b"])
    with pytest.raises(ValueError, match=r"'b\\n' is not an adapter name"):  # made a folder sampler/'b\n'
        cls.Config(members=["a", "b\n"])
    with pytest.raises(ValueError, match="in at most 128 characters"):  # sampler/NAME: File name too long, mid-run
        cls.Config(members=["a", "b" * 300])


def test_uniform_matchmaking_frequencies():
    t = make(members=4)
    t.pool = ["player-0@5"]
    t.rating["player-0@5"] = 1000.0
    picks = opponents(t, "player-0")
    assert sum(picks.values()) == N_DRAWS
    assert set(picks) == {"player-1", "player-2", "player-3", "player-0@5"}
    for name in picks:
        assert picks[name] / N_DRAWS == pytest.approx(0.25, abs=0.015)


def test_elo_matchmaking_prefers_near_ratings():
    t = make(members=4, matchmaking="elo", elo_scale=100.0)
    t.rating.update({"player-0": 1000.0, "player-1": 1050.0, "player-2": 1200.0, "player-3": 1400.0})
    weights = {m: math.exp(-abs(1000.0 - r) / 100.0) for m, r in t.rating.items() if m != "player-0"}
    total = sum(weights.values())
    picks = opponents(t, "player-0")
    for name, w in weights.items():
        assert picks[name] / N_DRAWS == pytest.approx(w / total, abs=0.015)


def test_elo_matchmaking_far_from_every_candidate_still_draws_the_nearest():
    """Each weight underflowed to 0 (a gap of 800 on a scale of 1): random.choices raised mid-run."""
    t = make(members=3, matchmaking="elo", elo_scale=1.0)
    t.rating.update({"player-0": 1000.0, "player-1": 1800.0, "player-2": 1900.0})
    drawn = {a for i in range(0, 30, 3) for a in t.match(1, i).values()}  # player-0's games
    assert drawn == {"player-0", "player-1"}


@pytest.mark.parametrize("weighting", ["even", "hard"])
def test_pfsp_matchmaking_follows_the_record(weighting):
    t = make(members=4, matchmaking="pfsp", pfsp_weighting=weighting)
    # player-0 beat player-1 in 9 of 10, scored 5 of 10 against player-2, 1 of 10 against player-3
    t.record = {"player-0": {"player-1": [9.0, 10], "player-2": [5.0, 10], "player-3": [1.0, 10]}}
    p = {"player-1": 10 / 12, "player-2": 6 / 12, "player-3": 2 / 12}
    f = {m: v * (1 - v) if weighting == "even" else (1 - v) ** 2 for m, v in p.items()}
    picks = opponents(t, "player-0")
    for name, w in f.items():
        assert picks[name] / N_DRAWS == pytest.approx(w / sum(f.values()), abs=0.015)
    top = picks.most_common(1)[0][0]
    assert top == ("player-2" if weighting == "even" else "player-3")


def test_draws_repeat_for_the_same_seed_step_and_episode():
    a, b = make(matchmaking="uniform", seed=3), make(matchmaking="uniform", seed=3)
    assert [a.match(7, i) for i in range(40)] == [b.match(7, i) for i in range(40)]
    assert [a.match(7, i) for i in range(40)] != [make(seed=4).match(7, i) for i in range(40)]


def scripted_step(t, step: int, winner_of) -> dict[str, float]:
    """One step of 8 episodes where ``winner_of(seats)`` names the winning adapter (None: draw)."""
    episodes, rewards = [], []
    for i in range(8):
        seats = t.adapters_for(step, i)
        won = winner_of(seats)
        episodes.append(EpisodeRecord(id=f"{step}-{i}", index=i, team="t", task={}, seed=0, adapters=seats))
        rewards.append({p: 0.0 if won is None else 1.0 if a == won else -1.0 for p, a in seats.items()})
    t.advantages([rewards[:4], rewards[4:]])
    return t.after_step(step, episodes, rewards, lambda adapter, name: None)


def test_elo_and_records_on_scripted_results():
    t = make(members=2, elo_k=16.0)
    t.result("player-0", "player-1", 1.0)  # equal ratings: expected 1/2, so K/2 moves across
    assert t.rating == {"player-0": 1008.0, "player-1": 992.0}
    assert t.record == {"player-0": {"player-1": [1.0, 1]}, "player-1": {"player-0": [0.0, 1]}}
    t.result("player-1", "player-0", 0.5)  # a draw moves the lower-rated side up
    assert t.rating["player-1"] > 992.0 and t.record["player-0"]["player-1"] == [1.5, 2]
    # an upset at 200 points apart: expected 1 / (1 + 10^(200/400)), K as configured
    t = make(members=2, elo_k=32.0)
    t.rating.update({"player-0": 1200.0, "player-1": 1000.0})
    t.result("player-1", "player-0", 1.0)
    gain = 32.0 * (1.0 - 1.0 / (1.0 + 10 ** 0.5))
    assert t.rating == pytest.approx({"player-0": 1200.0 - gain, "player-1": 1000.0 + gain}) and gain == pytest.approx(24.31, abs=0.01)

    t = make(members=4)
    metrics = scripted_step(t, 1, lambda seats: "player-3" if "player-3" in seats.values() else None)
    assert metrics["win_rate/player-3"] == 1.0 and metrics["elo/player-3"] > 1000.0
    assert all(metrics[f"elo/player-{k}"] <= 1000.0 for k in range(3))
    assert sum(t.rating.values()) == pytest.approx(4000.0)  # Elo moves points, it makes none
    # a drawn game is half a point each: records and ratings as two equals left them
    t = make(members=2, snapshot_every=2)
    metrics = scripted_step(t, 1, lambda seats: None)
    assert t.record["player-0"]["player-1"] == [4.0, 8] and t.rating == {"player-0": 1000.0, "player-1": 1000.0}
    assert metrics["win_rate/player-0"] == 0.5
    # a snapshot starts at its member's rating, not at the start's
    t.result("player-0", "player-1", 1.0)
    metrics = t.after_step(2, [], [], lambda adapter, name: None)
    assert t.rating["player-0@2"] == t.rating["player-0"] == metrics["elo/player-0@2"] == 1008.0


def test_results_are_read_from_the_seat_the_focal_member_held_in_a_later_step():
    """Episode 0 of step 2 is the run's fifth: player-0 in seat o, not x as in step 1."""
    t = make(members=4, episodes_per_step=4)
    seats = t.adapters_for(2, 0)
    assert seats["o"] == "player-0"
    ep = EpisodeRecord(id="2-0", index=0, team="t", task={}, seed=0, adapters=seats)
    metrics = t.after_step(2, [ep], [{"x": 1.0, "o": -1.0}], lambda adapter, name: None)
    assert metrics["win_rate/player-0"] == 0.0 and t.rating["player-0"] < 1000.0 < t.rating[seats["x"]]


def test_with_three_seats_the_focal_member_wins_only_by_beating_the_opponents_best_seat():
    cls = default_registry().get("trainers", "population")
    t = cls(TrainerContext(adapters={"x": "player", "o": "player", "z": "player"}, config=cls.Config(members=2)))
    seats = t.adapters_for(1, 0)
    assert seats == {"x": "player-0", "o": "player-1", "z": "player-1"}
    ep = EpisodeRecord(id="1-0", index=0, team="t", task={}, seed=0, adapters=seats)
    metrics = t.after_step(1, [ep], [{"x": 0.5, "o": 0.0, "z": 1.0}], lambda adapter, name: None)
    assert metrics["win_rate/player-0"] == 0.0 and t.record["player-1"]["player-0"] == [1.0, 1]


def test_each_member_is_centred_on_its_own_rewards_in_its_group():
    t = make(members=4)
    rewards = []
    seats = [t.adapters_for(1, i) for i in range(8)]
    for i, s in enumerate(seats):
        rewards.append({"x": float(i), "o": float(-i)})
    adv = t.advantages([rewards[:4], rewards[4:]])
    for g in range(2):
        for member in t.members:
            places = [(e, p) for e in range(4) for p in ("x", "o") if seats[4 * g + e][p] == member]
            own = [rewards[4 * g + e][p] for e, p in places]
            assert [adv[g][e][p] for e, p in places] == pytest.approx([r - statistics.mean(own) for r in own])


def own_advantages(seats, rewards, member):
    """``member``'s (group of four, episode, seat) places in ``seats`` and the rewards it was centred on."""
    places = [(i // 4, i % 4, p) for i in range(len(seats)) for p in ("x", "o") if seats[i][p] == member]
    return places, [rewards[4 * g + e][p] for g, e, p in places]


def test_a_snapshots_seat_gets_no_advantage_and_is_in_no_baseline():
    t = make(members=2)
    t.pool, t.rating["player-0@1"] = ["player-0@1"], 1000.0
    seats = [t.adapters_for(1, i) for i in range(8)]
    assert any("player-0@1" in s.values() for s in seats)
    rewards = [{"x": float(i), "o": float(-i * i)} for i in range(8)]
    adv = t.advantages([rewards[:4], rewards[4:]])
    assert all(adv[i // 4][i % 4][p] == 0.0 for i in range(8) for p in ("x", "o") if seats[i][p] == "player-0@1")
    for member in t.members:
        places, own = own_advantages(seats, rewards, member)
        for g in range(2):
            mine = [r for (h, _, _), r in zip(places, own) if h == g]
            assert [adv[g][e][p] for h, e, p in places if h == g] == pytest.approx([r - statistics.mean(mine) for r in mine])


def test_steps_drawn_ahead_are_credited_each_with_its_own_seats():
    """Async training draws step 2's matches before step 1 is credited: each step's advantages
    read the seats drawn for it, oldest first, once."""
    t = make(members=4, baseline="step")
    seats = {step: [t.adapters_for(step, i) for i in range(8)] for step in (1, 2)}
    assert seats[1] != seats[2]
    rewards = [{"x": float(i * i), "o": float(-i)} for i in range(8)]
    for step in (1, 2):
        adv = t.advantages([rewards[:4], rewards[4:]])
        for member in t.members:
            places, own = own_advantages(seats[step], rewards, member)
            assert [adv[g][e][p] for g, e, p in places] == pytest.approx([r - statistics.mean(own) for r in own])
    assert not t._seats


def test_scale_std_divides_each_members_centred_rewards_by_their_std():
    t = make(members=4, baseline="step", scale_std=True)
    seats = [t.adapters_for(1, i) for i in range(8)]
    rewards = [{"x": float(i * i), "o": float(-i)} for i in range(8)]
    adv = t.advantages([rewards[:4], rewards[4:]])
    for member in t.members:
        places, own = own_advantages(seats, rewards, member)
        expected = [(r - statistics.mean(own)) / (statistics.pstdev(own) + 1e-6) for r in own]
        assert [adv[g][e][p] for g, e, p in places] == pytest.approx(expected) and statistics.pstdev(own) != 1.0


def test_a_failed_episode_is_in_no_members_baseline():
    t, again = make(members=4), make(members=4)
    seats = [t.adapters_for(1, i) for i in range(8)]
    assert seats == [again.adapters_for(1, i) for i in range(8)]
    rewards = [{"x": float(i), "o": float(-i)} for i in range(8)]
    finished = [[True, False, True, True], [True] * 4]
    adv = t.step_advantages([rewards[:4], rewards[4:]], finished)
    assert adv[0][1] == {"x": 0.0, "o": 0.0}
    # each member is centred on the seats it held in finished episodes alone
    for g in range(2):
        for member in t.members:
            places = [(e, p) for e in range(4) for p in ("x", "o") if seats[4 * g + e][p] == member and finished[g][e]]
            own = [rewards[4 * g + e][p] for e, p in places]
            assert [adv[g][e][p] for e, p in places] == pytest.approx([r - statistics.mean(own) for r in own])


def test_a_step_baseline_centres_each_member_on_all_its_rewards_in_the_step():
    by_step, by_group = make(members=4, baseline="step"), make(members=4)
    seats = [by_step.adapters_for(1, i) for i in range(8)]
    assert seats == [by_group.adapters_for(1, i) for i in range(8)]  # same seed: same matches
    rewards = [{"x": float(i * i), "o": float(-i)} for i in range(8)]
    step_adv = by_step.advantages([rewards[:4], rewards[4:]])
    group_adv = by_group.advantages([rewards[:4], rewards[4:]])
    for member in by_step.members:
        places = [(i, p) for i in range(8) for p in ("x", "o") if seats[i][p] == member]
        own = [rewards[i][p] for i, p in places]
        assert [step_adv[i // 4][i % 4][p] for i, p in places] == pytest.approx([r - statistics.mean(own) for r in own])
    # A member that plays once in its group of four gets nothing from the group baseline; the
    # step baseline still compares it with its games in the other group.
    group_of = lambda i: range(4 * (i // 4), 4 * (i // 4) + 4)  # noqa: E731
    lonely = [(i, p) for i in range(8) for p in ("x", "o")
              if sum(seats[j][q] == seats[i][p] for j in group_of(i) for q in ("x", "o")) == 1]
    assert lonely
    for i, p in lonely:
        assert group_adv[i // 4][i % 4][p] == 0.0 and step_adv[i // 4][i % 4][p] != 0.0


def test_snapshots_join_a_bounded_pool_in_turn_and_state_round_trips():
    t = make(members=3, snapshot_every=1, pool_size=2, matchmaking="pfsp")
    taken = []
    for step in range(1, 5):
        t.after_step(step, [], [], lambda adapter, name: taken.append((adapter, name)))
    assert taken == [("player-0", "player-0@1"), ("player-1", "player-1@2"),
                     ("player-2", "player-2@3"), ("player-0", "player-0@4")]
    assert t.pool == t.opponent_adapters() == ["player-2@3", "player-0@4"]
    assert set(t.rating) == {"player-0", "player-1", "player-2", "player-2@3", "player-0@4"}
    scripted_step(t, 5, lambda seats: sorted(seats.values())[0])
    assert any(a.endswith("@4") or a.endswith("@3") for row in t.record.values() for a in row)

    fresh = make(members=3, snapshot_every=1, pool_size=2, matchmaking="pfsp")
    fresh.load_state_dict(t.state_dict())
    assert fresh.state_dict() == t.state_dict()
    assert [fresh.match(6, i) for i in range(30)] == [t.match(6, i) for i in range(30)]
    with pytest.raises(ValueError, match="members"):
        make(members=2).load_state_dict(t.state_dict())


def test_a_snapshot_that_leaves_the_pool_leaves_the_records():
    """Its own row of results stayed: a checkpoint's records grew by a row each snapshot, for ever."""
    t = make(members=2, snapshot_every=1, pool_size=1, matchmaking="pfsp")
    t.after_step(1, [], [], lambda adapter, name: None)
    scripted_step(t, 2, lambda seats: sorted(seats.values())[0])  # games against player-0@1, which then leaves
    assert t.pool == ["player-1@2"]
    assert set(t.record) <= {"player-0", "player-1"} and not any("player-0@1" in row for row in t.record.values())


def test_evaluations_seat_each_member_in_turn():
    t = make(members=3)
    assert [t.eval_adapters_for(i)["x"] for i in range(6)] == ["player-0", "player-1", "player-2"] * 2
    assert all(t.eval_adapters_for(i)["o"] != t.eval_adapters_for(i)["x"] for i in range(6))


# -- end to end on the tiny model ----------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
MEMBERS = ["player-0", "player-1", "player-2", "player-3"]


@pytest.mark.parametrize("recipe, seats", [
    ("rps_population", ["alice", "bob"]), ("tictactoe_population", ["o", "x"]), ("debate_population", ["con", "pro"]),
])
def test_population_recipes_train_every_member(cli, tmp_path, recipe, seats):
    text = (ROOT / "recipes" / f"{recipe}.yaml").read_text()
    if recipe == "debate_population":  # the tiny model fills every token budget: keep them short
        text = text.replace("rounds: 2", "rounds: 1").replace("{adapter: debater}", "{adapter: debater, sampling: {max_tokens: 8}}")
        text = text.replace("  - use: judge", "  - {use: judge, policy: {sampling: {max_tokens: 6}}, max_retries: 0}")
    (tmp_path / "recipe.yaml").write_text(text)
    run = tmp_path / "run"
    train_tiny(cli, tmp_path / "recipe.yaml", run, 2, "--set", "group_size=4")
    prefix = "debater" if recipe.startswith("debate") else "player"
    assert sorted(p.name for p in (run / "sampler").iterdir()) == [m.replace("player", prefix) for m in MEMBERS]
    for step in (1, 2):
        lines = credit(run, step)
        assert len(lines) == 4
        # four episodes, one per focal member: every member played, and only members played
        assert {a for line in lines for a in line["adapters"].values()} == {m.replace("player", prefix) for m in MEMBERS}
        assert all(line["trained"] == seats for line in lines)  # no pool yet: every seat is a learner
    train_rows = [r for r in metric_rows(run) if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2]
    for m in MEMBERS:
        member = m.replace("player", prefix)
        assert f"elo/{member}" in train_rows[-1] and f"{member}/version" in train_rows[-1]


def test_resume_restores_the_population_exactly(cli, tmp_path):
    recipe = tmp_path / "rps.yaml"
    text = (ROOT / "recipes/rps_population.yaml").read_text()
    recipe.write_text(text.replace("snapshot_every: 5", "snapshot_every: 1"))
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_tiny(cli, recipe, straight, 3, "--set", "group_size=4")
    train_tiny(cli, recipe, resumed, 2, "--set", "group_size=4")
    train_tiny(cli, recipe, resumed, 3, "--set", "group_size=4", "--resume")
    state = [json.loads((run / "checkpoints/step-000003/trainer.json").read_text()) for run in (straight, resumed)]
    assert state[0] == state[1] and len(state[0]["trainer"]["pool"]) == 3  # ratings, records, pool, turn
    assert [line["adapters"] for line in credit(straight, 3)] == [line["adapters"] for line in credit(resumed, 3)]
    assert sorted(p.name for p in (resumed / "pool").iterdir()) == state[0]["trainer"]["pool"]
    # the members' start noise (the recipe's init_noise, 0.3) is drawn once, not again on --resume.
    # Within float noise only: fp32 matmuls on the CPU (the AVX2 path trains in fp32) are not
    # bit-reproducible between processes; two straight runs differed by up to 4e-6.
    for member in MEMBERS:
        weights = [load_file(str(run / "sampler" / member / "adapter_model.safetensors")) for run in (straight, resumed)]
        assert all(torch.allclose(weights[0][k], weights[1][k], atol=1e-4) for k in weights[0])
    # and each member its own noise: members started alike (none, or the same draw) never part
    b = [{k: v for k, v in load_file(str(straight / "sampler" / m / "adapter_model.safetensors")).items() if "lora_B" in k}
         for m in MEMBERS]
    assert b[0] and all(max((b[i][k] - b[j][k]).abs().max().item() for k in b[0]) > 0.1
                        for i in range(len(MEMBERS)) for j in range(i))


def test_a_result_against_a_snapshot_that_left_the_pool_meanwhile_is_no_crash():
    """Async training draws a step's matches before the step before it snapshots and evicts."""
    t = make(members=2, snapshot_every=1, pool_size=1)
    t.after_step(1, [], [], lambda adapter, name: None)
    ahead = [t.adapters_for(3, i) for i in range(40)]
    t.after_step(2, [], [], lambda adapter, name: None)  # player-0@1 leaves the pool
    episodes = [EpisodeRecord(id=f"3-{i}", index=i, team="t", task={}, seed=0, adapters=s) for i, s in enumerate(ahead)]
    t.after_step(3, episodes, [{"x": 1.0, "o": -1.0}] * len(ahead), lambda adapter, name: None)
    assert any("player-0@1" in s.values() for s in ahead) and "player-0@1" not in t.rating
    assert all("player-0@1" not in row for row in t.record.values())
    against_members = sum(s["o" if t.focal(i)[1] == "x" else "x"] in t.members for i, s in enumerate(ahead))
    assert sum(games for row in t.record.values() for _, games in row.values()) == 2 * against_members > 0
