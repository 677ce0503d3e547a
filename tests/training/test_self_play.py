"""Self-play: learner alternation, opponent-pool sampling frequencies, snapshots, Elo."""
from __future__ import annotations

import pytest

from orchestrator.registry import default_registry
from orchestrator.training.trainer import TrainerContext
from orchestrator.transcript import EpisodeRecord


def make(**config):
    cls = default_registry().get("trainers", "self-play")
    return cls(TrainerContext(adapters={"x": "player", "o": "player"}, config=cls.Config(**config)))


def fill_pool(t, names):
    t.pool = list(names)
    t.record = {n: [0, 0] for n in names}
    t.elo.update({n: 1000.0 for n in names})


def test_needs_players_sharing_one_adapter():
    cls = default_registry().get("trainers", "self-play")
    with pytest.raises(ValueError, match="sharing one adapter"):
        cls(TrainerContext(adapters={"x": "px", "o": "po"}))
    with pytest.raises(ValueError, match="sharing one adapter"):  # roles that do not learn
        cls(TrainerContext(adapters={"x": "player", "o": "player"}, config=cls.Config(players=["judge", "referee"])))
    with pytest.raises(ValueError, match="two or more"):  # a one-player game
        cls(TrainerContext(adapters={"x": "player"}))


def test_without_a_pool_everyone_plays_the_live_adapter():
    t = make()
    assert all(t.adapters_for(1, i) == {} for i in range(50))
    assert [t.learner(i) for i in range(4)] == ["x", "o", "x", "o"]


def test_a_seat_a_snapshot_held_is_in_no_baseline():
    """Against a snapshot only the learner's seat is the live adapter's: the other seat's reward
    says how the snapshot did, and a group that holds each seat live once compares nothing."""
    rewards = [[{"x": 3.0, "o": -3.0}, {"x": 1.0, "o": -1.0}], [{"x": 2.0, "o": 0.0}, {"x": 0.0, "o": 2.0}]]
    against_pool, live = make(latest_prob=0.0), make(latest_prob=1.0)
    for t in (against_pool, live):
        fill_pool(t, ["player@1"])
    assert [against_pool.adapters_for(1, i) for i in range(4)] == [{"o": "player@1"}, {"x": "player@1"}] * 2
    assert [live.adapters_for(1, i) for i in range(4)] == [{}] * 4
    adv = against_pool.step_advantages(rewards, [[True, True]] * 2)
    assert adv == [[{"x": 0.0, "o": 0.0}] * 2] * 2  # each seat live once per group
    assert live.step_advantages(rewards, [[True, True]] * 2) == live.advantages(rewards)  # no snapshot: GRPO's


def test_pool_sampling_frequencies_uniform():
    t = make(latest_prob=0.8)
    fill_pool(t, ["player@5", "player@10", "player@15", "player@20"])
    n = 20000
    picks = [t.opponent(step, i) for step in range(1, 5) for i in range(n // 4)]
    latest = picks.count(None) / n
    assert latest == pytest.approx(0.8, abs=0.015)
    for name in t.pool:
        assert picks.count(name) / n == pytest.approx(0.05, abs=0.01)
    # the learner's own side is never overridden; the other side plays the snapshot
    overrides = [t.adapters_for(3, i) for i in range(200)]
    assert 20 <= sum(bool(o) for o in overrides) <= 60  # about 1 - latest_prob of the episodes
    for i, over in enumerate(overrides):
        assert t.learner(i) not in over and all(v in t.pool for v in over.values())


def test_pool_sampling_by_win_rate():
    t = make(latest_prob=0.0, sampling="win_rate")
    fill_pool(t, ["strong", "weak"])
    t.record = {"strong": [8, 10], "weak": [0, 10]}  # (w+1)/(n+2): 0.75 vs 0.0833
    picks = [t.opponent(1, i) for i in range(20000)]
    assert picks.count("strong") / len(picks) == pytest.approx(0.75 / (0.75 + 1 / 12), abs=0.015)


def test_win_rate_sampling_counts_each_snapshots_games():
    t = make(latest_prob=0.0, sampling="win_rate")
    fill_pool(t, ["new", "old"])
    t.record = {"new": [0, 0], "old": [9, 98]}  # (w+1)/(n+2): 0.5, and 0.1 for one that won 9 of 98
    picks = [t.opponent(1, i) for i in range(20000)]
    assert picks.count("new") / len(picks) == pytest.approx(0.5 / 0.6, abs=0.015)


def test_against_a_snapshot_the_learners_seat_and_a_role_outside_the_players_are_in_the_baseline():
    cls = default_registry().get("trainers", "self-play")
    t = cls(TrainerContext(adapters={"x": "player", "o": "player", "judge": "judge"},
                           config=cls.Config(players=["x", "o"], latest_prob=0.0)))
    fill_pool(t, ["player@1"])
    assert [t.adapters_for(1, i) for i in range(4)] == [{"o": "player@1"}, {"x": "player@1"}] * 2
    rewards = [[{"x": 4.0, "o": 0.0, "judge": 1.0}, {"x": 0.0, "o": 2.0, "judge": 0.0},
                {"x": 2.0, "o": 0.0, "judge": 0.0}, {"x": 0.0, "o": 4.0, "judge": 3.0}]]
    adv = t.step_advantages(rewards, [[True] * 4])
    assert adv == [[{"x": 1.0, "o": 0.0, "judge": 0.0}, {"x": 0.0, "o": -1.0, "judge": -1.0},
                    {"x": -1.0, "o": 0.0, "judge": -1.0}, {"x": 0.0, "o": 1.0, "judge": 2.0}]]


def test_a_learner_beats_a_snapshot_only_by_beating_every_seat_it_holds():
    cls = default_registry().get("trainers", "self-play")
    t = cls(TrainerContext(adapters={"a": "p", "b": "p", "c": "p"}, config=cls.Config(latest_prob=0.0, snapshot_every=0)))
    fill_pool(t, ["p@1"])
    ep = EpisodeRecord(id="1-0", index=0, team="t", task={}, seed=0, adapters=t.adapters_for(1, 0))
    assert ep.adapters == {"b": "p@1", "c": "p@1"}
    metrics = t.after_step(1, [ep], [{"a": 1.0, "b": 0.0, "c": 2.0}], lambda adapter, name: None)
    assert metrics["win_rate/vs_pool"] == 0.0 and t.record == {"p@1": [1, 1]}  # c outscored the learner


def test_after_step_reports_the_win_rate_against_each_kind_of_opponent_and_the_ratings_moved_by_elo_k():
    t = make(snapshot_every=0, elo_k=32.0)
    fill_pool(t, ["player@1"])
    live = EpisodeRecord(id="1-0", index=0, team="t", task={}, seed=0, adapters={})  # x learns, and loses
    pooled = EpisodeRecord(id="1-1", index=1, team="t", task={}, seed=0, adapters={"x": "player@1"})  # o learns, and wins
    metrics = t.after_step(1, [live, pooled], [{"x": -1.0, "o": 1.0}] * 2, lambda adapter, name: None)
    assert metrics == {"win_rate/vs_latest": 0.0, "win_rate/vs_pool": 1.0, "elo/latest": 1016.0, "elo/player@1": 984.0}
    metrics = t.after_step(2, [live], [{"x": 1.0, "o": -1.0}], lambda adapter, name: None)
    assert "win_rate/vs_pool" not in metrics  # no game against the pool is no figure, not a 0


def test_after_step_snapshots_bounded_pool_and_elo():
    t = make(snapshot_every=2, pool_size=2, latest_prob=0.0)
    saved = []

    def snapshot(adapter, name):
        saved.append((adapter, name))

    for step in range(1, 7):
        episodes, rewards = [], []
        for i in range(4):
            ep = EpisodeRecord(id=f"{step}-{i}", index=i, team="t", task={}, seed=0, adapters=t.adapters_for(step, i))
            me = t.learner(i)
            episodes.append(ep)
            rewards.append({me: 1.0, ("o" if me == "x" else "x"): -1.0})  # the learner always wins
        metrics = t.after_step(step, episodes, rewards, snapshot)
    assert saved == [("player", "player@2"), ("player", "player@4"), ("player", "player@6")]
    assert t.pool == ["player@4", "player@6"] and set(t.record) == {"player@4", "player@6"}
    assert set(t.elo) == {"latest", "player@4", "player@6"}  # player@2's rating left with it
    assert t.opponent_adapters() == t.pool  # what --resume loads back into the engine
    assert metrics["win_rate/vs_pool"] == 1.0
    assert t.elo["latest"] > t.elo["player@4"]  # it kept beating the snapshot it was rated equal to
    assert t.elo["player@6"] == t.elo["latest"]  # a snapshot joins at the learner's rating, not at 1000
    # [the snapshot's wins, games] against the learner, which won every game: what win_rate sampling draws by
    assert t.record == {"player@4": [0, 6], "player@6": [0, 0]}
    state = t.state_dict()
    fresh = make(snapshot_every=2, pool_size=2)
    fresh.load_state_dict(state)
    assert fresh.pool == t.pool and fresh.elo == t.elo and fresh.record == t.record  # --resume draws as the run did


def test_a_result_against_a_snapshot_that_left_the_pool_meanwhile_is_no_crash():
    """Async training draws a step's opponents before the step before it snapshots and evicts."""
    t = make(snapshot_every=1, pool_size=1, latest_prob=0.0)
    t.after_step(1, [], [], lambda adapter, name: None)
    ahead = [EpisodeRecord(id=f"3-{i}", index=i, team="t", task={}, seed=0, adapters=t.adapters_for(3, i)) for i in range(2)]
    t.after_step(2, [], [], lambda adapter, name: None)  # player@1 leaves the pool
    metrics = t.after_step(3, ahead, [{"x": 1.0, "o": -1.0}, {"x": 1.0, "o": -1.0}], lambda adapter, name: None)
    assert {a for ep in ahead for a in ep.adapters.values()} == {"player@1"}
    assert metrics["win_rate/vs_pool"] == 0.5 and t.elo["latest"] == 1000.0  # no rating moved against it


@pytest.mark.parametrize("staleness", [0, 1])
def test_snapshots_that_leave_the_pool_leave_the_engine(cli, tmp_path, monkeypatch, staleness):
    """The engine stacks every loaded adapter into each decode step: a snapshot the pool let go
    stayed loaded, so a long run held (and computed with) every snapshot it had taken. Under
    async training one leaves once the rollouts that began while it was kept have finished."""
    import json

    from orchestrator.engines.hf import HFEngine
    from support import ROOT, train_tiny

    loaded, removed = [], []
    load, remove = HFEngine.load_adapter, HFEngine.remove_adapter
    monkeypatch.setattr(HFEngine, "load_adapter", lambda self, name, path: loaded.append(name) or load(self, name, path))
    monkeypatch.setattr(HFEngine, "remove_adapter", lambda self, name: removed.append(name) or remove(self, name))
    recipe = tmp_path / "rps.yaml"
    recipe.write_text((ROOT / "recipes/rps.yaml").read_text().replace("snapshot_every: 5, pool_size: 5", "snapshot_every: 1, pool_size: 1"))
    run = tmp_path / "run"
    train_tiny(cli, recipe, run, 4, "--set", f"max_staleness={staleness}")
    snapshots = [name for name in loaded if "@" in name]
    assert snapshots == ["player@1", "player@2", "player@3", "player@4"]
    assert removed == ["player@1", "player@2", "player@3"]
    for step in range(1, 5):
        for line in (run / "rollouts" / f"step-{step:06d}" / "transcripts.jsonl").read_text().splitlines():
            assert json.loads(line)["status"] == "ok"


def test_a_snapshot_leaves_the_engine_once_no_rollout_that_may_play_it_is_pending():
    from types import SimpleNamespace

    from orchestrator.training.loop import TrainingRun

    class Task:
        def __init__(self):
            self.finished = False

        def done(self):
            return self.finished

    removed, forgotten = [], []
    run = TrainingRun.__new__(TrainingRun)
    run.trainer, run.cfg = SimpleNamespace(opponent_adapters=lambda: ["p@2"]), SimpleNamespace(trainer="self-play")
    run.engine = SimpleNamespace(remove_adapter=removed.append)
    run.rollouts = SimpleNamespace(forget=forgotten.append)
    run._frozen, run._retiring = {"p@1", "p@2"}, {}
    playing, finished = Task(), Task()
    finished.finished = True
    run._retire([playing, finished])  # p@1 let go while the next step's rollout plays
    assert removed == [] and run._frozen == {"p@2"}
    run._retire([])
    assert removed == []
    playing.finished = True
    run._retire([])
    assert removed == forgotten == ["p@1"] and run._retiring == {}
    # a trainer that never lists its snapshots (the hook's default) keeps them: they were unloaded
    # at once, and its games against them fell back to the base model
    run.trainer, run._frozen = SimpleNamespace(opponent_adapters=lambda: []), set()
    run._retire([])
    assert removed == ["p@1"]


def test_step_advantages_read_the_oldest_steps_draws_by_each_episodes_index_in_the_step():
    """Async training draws step 2 before step 1 is credited; group 1's episodes are 2 and 3 of the step."""
    rewards = [[{"x": 4.0, "o": -4.0}, {"x": 0.0, "o": 0.0}]] * 2
    t = make(latest_prob=0.0)
    drawn = [t.adapters_for(1, i) for i in range(2)]  # no pool yet: the live adapter
    fill_pool(t, ["player@1"])
    drawn += [t.adapters_for(1, i) for i in range(2, 4)]  # snapshots: each seat live once in group 1
    t.pool = []
    assert [t.adapters_for(2, i) for i in range(4)] == [{}] * 4 and drawn[:2] == [{}, {}] and all(drawn[2:])
    adv = t.step_advantages(rewards, [[True, True]] * 2)
    assert adv == [[{"x": 2.0, "o": -2.0}, {"x": -2.0, "o": 2.0}], [{"x": 0.0, "o": 0.0}] * 2]
    assert t.step_advantages(rewards, [[True, True]] * 2) == [adv[0]] * 2  # step 2: live in both groups
    scaled = make(scale_std=True).step_advantages(rewards, [[True, True]] * 2)  # GRPO's scale_std: by the std, 2
    assert [e["x"] for e in scaled[0]] == pytest.approx([1.0, -1.0], rel=1e-5)


def test_a_draw_against_a_snapshot_scores_a_half_and_moves_both_ratings_by_elo():
    t = make(latest_prob=0.0, snapshot_every=0)
    fill_pool(t, ["player@1"])
    t.elo["player@1"] = 1100.0
    ep = EpisodeRecord(id="1-0", index=0, team="t", task={}, seed=0, adapters=t.adapters_for(1, 0))
    metrics = t.after_step(1, [ep], [{"x": 0.0, "o": 0.0}], lambda adapter, name: None)
    gain = 16.0 * (0.5 - 1 / (1 + 10 ** (100 / 400)))  # the learner, rated 100 lower, was expected to score 0.36
    assert metrics["win_rate/vs_pool"] == 0.5
    assert t.elo == pytest.approx({"latest": 1000.0 + gain, "player@1": 1100.0 - gain})
    assert t.record == {"player@1": [0, 1]}  # a draw is no snapshot win
