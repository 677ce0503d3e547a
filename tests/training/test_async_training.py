"""Async training (``max_staleness``): later steps' rollouts sample while a step trains, and each
turn keeps the adapter version it was sampled with."""
from __future__ import annotations

import json
from pathlib import Path

from support import credit, metric_rows, train_tiny

ROOT = Path(__file__).resolve().parents[2]


def versions(run: Path, step: int, role: str) -> set[int]:
    lines = (run / "rollouts" / f"step-{step:06d}" / "transcripts.jsonl").read_text().splitlines()
    return {a["adapter_version"] for line in lines for t in json.loads(line)["turns"] if t["role"] == role
            for a in t["attempts"]}


def test_the_next_rollout_samples_one_version_behind_and_still_trains(cli, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, ROOT / "recipes/code_pair.yaml", run, 3, "--set", "max_staleness=1")
    # version 1 is published before step 1; each step's update publishes the next
    assert versions(run, 1, "coder") == {1}
    assert 1 in versions(run, 2, "coder") <= {1, 2}  # started with step 1's rollout, before its update
    # started before step 2's update; in one process its turns may all wait for that update's jobs
    assert versions(run, 3, "coder") <= {2, 3}
    rows = {r["step"]: r for r in metric_rows(run) if r["kind"] == "train"}
    assert rows[1]["coder/staleness"] == 0.0 and 0.0 < rows[2]["coder/staleness"] <= 1.0
    assert all(rows[s]["coder/stale_dropped"] == 0 and rows[s]["coder/datums"] > 0 for s in rows)


def test_a_population_credits_each_step_with_its_own_seats_when_rollouts_overlap(cli, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, ROOT / "recipes/rps_population.yaml", run, 3, "--set", "group_size=4", "--set", "max_staleness=1")
    for step in (1, 2, 3):
        lines = (run / "rollouts" / f"step-{step:06d}" / "transcripts.jsonl").read_text().splitlines()
        played = {e["id"]: e["adapters"] for e in map(json.loads, lines)}
        assert {c["episode"]: c["adapters"] for c in credit(run, step)} == played


def test_staleness_is_the_mean_lag_of_the_attempts_trained_on():
    """``<adapter>/staleness``: how many versions behind the learner its trained attempts were
    sampled, on average over them (4 attempts 0, 1, 1 and 2 behind: 1.0, not the most, 2)."""
    import asyncio
    from types import SimpleNamespace

    from orchestrator.config import TrainingConfig
    from orchestrator.training.loop import TrainingRun

    run = TrainingRun.__new__(TrainingRun)
    run.cfg, run.options = TrainingConfig(max_staleness=2), SimpleNamespace(seed=0)
    run._datums = lambda adapter, *_: ([((1.0, None), n) for n in range(4)], [0, 1, 1, 2], {"pro/stale_dropped": 3})

    async def minibatch(batches):
        return {"pro": {}}

    async def publish(adapter):
        return 5

    run._minibatch, run._publish = minibatch, publish
    row = asyncio.run(run._update(1, ["pro"], [], None, None))
    assert (row["pro/staleness"], row["pro/stale_dropped"], row["pro/datums"]) == (1.0, 3, 4)


def test_an_adapter_whose_every_attempt_was_too_stale_says_so_and_staleness_is_async_trainings_alone():
    """Every attempt dropped as too stale: the row says 0 datums and how many were dropped (the count
    was lost with the datums), and publishes nothing; without max_staleness no staleness figure."""
    import asyncio
    from types import SimpleNamespace

    from orchestrator.config import TrainingConfig
    from orchestrator.training.loop import TrainingRun

    published: list[str] = []

    def update(max_staleness: int, plan) -> dict:
        run = TrainingRun.__new__(TrainingRun)
        run.cfg, run.options = TrainingConfig(max_staleness=max_staleness), SimpleNamespace(seed=0)
        run._datums = lambda adapter, *_: plan

        async def minibatch(batches):
            return {"pro": {}}

        async def publish(adapter):
            published.append(adapter)
            return 5

        run._minibatch, run._publish = minibatch, publish
        return asyncio.run(run._update(1, ["pro"], [], None, None))

    assert update(2, ([], [], {"pro/stale_dropped": 3})) == {"pro/datums": 0, "pro/stale_dropped": 3} and not published
    assert "pro/staleness" not in update(0, ([((1.0, None), 0)], [0], {}))
