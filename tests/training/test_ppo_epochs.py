"""PPO epochs and minibatches: a step's datums in several optimizer steps, so that importance
ratios leave 1 and clipping bites (with one step per batch the ratio is always 1)."""
from __future__ import annotations

import asyncio

import pytest
from orchestrator.registry import discover
from orchestrator.team import load_team
from orchestrator.training.client import ServiceClient
from orchestrator.training.loop import TrainingRun, TrainOptions
from orchestrator.training.trainer import Trainer
from support import plugin, tiny_engine, train_recipe


class AlwaysUp(Trainer):
    """Advantage +1 for every action: pushes up what was sampled, so the ratios grow."""

    def advantages(self, rewards):
        return [[{role: 1.0 for role in episode} for episode in group] for group in rewards]


def one_step(tmp_path, epochs: int, minibatches: int) -> tuple[dict, TrainingRun]:
    registry = discover()
    registry.add_module(plugin(register_trainers=lambda register: register("always-up", AlwaysUp)), "test", "test")
    path = train_recipe(tmp_path, 1)
    # debaters sample 16 tokens, not 6: enough free (unforced) tokens that some ratio leaves the clip range
    text = path.read_text().replace("adapter: pro, sampling: {max_tokens: 6}", "adapter: pro, sampling: {max_tokens: 16}").replace(
        "adapter: con, sampling: {max_tokens: 6}", "adapter: con, sampling: {max_tokens: 16}").replace("trainer: grpo", "trainer: always-up").replace(
        "adam: {learning_rate: 1.0e-3}", f"adam: {{learning_rate: 0.05}}\n  ppo_epochs: {epochs}\n  minibatches: {minibatches}")
    path.write_text(text)
    engine, service = tiny_engine(), ServiceClient("tiny", bf16_autocast=False)
    service.attach_engine(engine)
    run = TrainingRun(load_team(path, registry), TrainOptions(out_dir=tmp_path / "run", model="tiny", progress=False),
                      engine, service, registry)

    async def go():
        try:
            await run._publish_all()
            return await run.train_step(1)
        finally:
            await engine.aclose()
            service.close()

    return asyncio.run(go()), run


def test_the_second_epoch_clips(tmp_path):
    row, run = one_step(tmp_path, epochs=2, minibatches=1)
    for adapter in ("pro", "con"):
        assert row[f"{adapter}/datums"] > 0
        assert row[f"{adapter}/epoch1/clip_fraction"] == 0.0  # on-policy: every ratio is 1
        assert row[f"{adapter}/epoch1/approx_kl"] == pytest.approx(0.0, abs=1e-4)
        assert row[f"{adapter}/epoch2/clip_fraction"] > 0.0  # the policy moved, past 1.2 on some tokens
        assert row[f"{adapter}/epoch2/approx_kl"] > 1e-3
        assert run.clients[adapter].step == 2  # one optimizer step per pass


def test_minibatches_are_optimizer_steps(tmp_path):
    row, run = one_step(tmp_path, epochs=1, minibatches=2)
    assert [run.clients[a].step for a in ("pro", "con")] == [2, 2]
    assert "pro/epoch1/clip_fraction" not in row and row["pro/clip_fraction"] >= 0.0


def updated(cfg, datums, minibatch, step: int = 1, seed: int = 0) -> dict:
    """``_update``'s row for one step of a run faked around it: ``datums`` maps each adapter to its
    datums (stand-ins), ``minibatch(batches)`` answers each optimizer step's call with its rows."""
    from types import SimpleNamespace

    run = TrainingRun.__new__(TrainingRun)
    run.cfg, run.options = cfg, SimpleNamespace(seed=seed)
    run._datums = lambda adapter, *_: ([((1.0, None), d) for d in datums[adapter]], [], {})

    async def publish(adapter):
        return 2

    run._minibatch, run._publish = minibatch, publish
    return asyncio.run(run._update(step, list(datums), [], None, None))


def answering(rows: list[dict]):
    """A ``minibatch`` that answers pro's optimizer steps with ``rows``, in turn."""
    rows = iter(rows)

    async def minibatch(batches):
        return {"pro": next(rows)}

    return minibatch


def test_minibatches_that_do_not_divide_the_datums_are_still_that_many_optimizer_steps():
    """5 datums in 4 minibatches are 4 optimizer steps (2, 1, 1, 1), not 3 chunks of ceil(5 / 4)."""
    from orchestrator.config import TrainingConfig

    sizes = []

    async def minibatch(batches):
        sizes.append(len(batches["pro"]))
        return {"pro": {}}

    updated(TrainingConfig(minibatches=4), {"pro": range(5)}, minibatch)
    assert sorted(sizes, reverse=True) == [2, 1, 1, 1]


def test_minibatches_are_drawn_from_the_datums_shuffled_and_seeded_by_step():
    """docs/training.md: the datums go through the passes shuffled, seeded by step: in rollout order
    a minibatch held one group's episodes, and every step the same split of them."""
    from orchestrator.config import TrainingConfig

    def chunks(step: int, epochs: int, seed: int = 0) -> list[list[int]]:
        seen = []

        async def minibatch(batches):
            seen.append([n for _, n in batches["pro"]])
            return {"pro": {}}

        updated(TrainingConfig(minibatches=2, ppo_epochs=epochs), {"pro": range(8)}, minibatch, step, seed)
        return seen

    first = chunks(1, epochs=1)
    assert sorted(n for chunk in first for n in chunk) == list(range(8)) and len(first) == 2
    assert first != [[0, 1, 2, 3], [4, 5, 6, 7]]  # shuffled, though one pass
    assert chunks(1, epochs=1) == first and chunks(2, epochs=1) != first  # by the step's seed
    assert chunks(1, epochs=1, seed=1) != first  # and the run's: another --seed, other minibatches
    two = chunks(1, epochs=2)
    assert two[:2] != two[2:]  # each pass shuffled anew


def test_a_steps_row_counts_all_its_minibatches_tokens():
    """Minibatches of 30 and 10 action tokens, 10 of the first's clipped: the step trained 40 tokens
    and clipped a quarter of them (a mean over the minibatches read 20 tokens, a sixth clipped);
    the loss and grad_norm stay means over the optimizer steps."""
    from orchestrator.config import TrainingConfig

    row = updated(TrainingConfig(minibatches=2), {"pro": range(4)}, answering([
        {"loss": 0.4, "loss:sum": 12.0, "tokens": 30.0, "clip_fraction": 1 / 3, "grad_norm": 1.0},
        {"loss": 0.2, "loss:sum": 2.0, "tokens": 10.0, "clip_fraction": 0.0, "grad_norm": 3.0}]))
    assert (row["pro/tokens"], row["pro/loss:sum"]) == (40.0, 14.0)
    assert row["pro/clip_fraction"] == pytest.approx(0.25)
    assert row["pro/loss"] == pytest.approx(0.3) and row["pro/grad_norm"] == 2.0


def test_an_adapter_with_fewer_datums_than_minibatches_trains_each_once_beside_one_with_more():
    """minibatches: 4 with 5 datums for pro and 2 for con: pro takes 4 optimizer steps, con 2, every
    datum in one of them and no batch empty (con's 2 datums were not cut into 4 chunks, two of them
    empty; nor did pro's last two wait on con's, never trained)."""
    from orchestrator.config import TrainingConfig

    seen = []
    datums = {a: [f"{a}{n}" for n in range(size)] for a, size in (("pro", 5), ("con", 2))}

    async def minibatch(batches):
        seen.append({a: [d for _, d in items] for a, items in batches.items()})
        return {a: {} for a in batches}

    updated(TrainingConfig(minibatches=4), datums, minibatch)
    assert [sorted(batch) for batch in seen] == [["con", "pro"], ["con", "pro"], ["pro"], ["pro"]]
    assert all(batch[a] for batch in seen for a in batch)
    for adapter, names in datums.items():
        assert sorted(d for batch in seen for d in batch.get(adapter, [])) == names


def test_a_steps_row_is_the_mean_of_its_passes_beside_each_pass_own():
    """Two epochs, the second clipping half its tokens: the row's clip_fraction and grad_norm are the
    passes' mean (not the last pass's), epochN/ gives each pass; one epoch gives no epochN/ keys."""
    from orchestrator.config import TrainingConfig

    def update(epochs: int) -> dict:
        return updated(TrainingConfig(ppo_epochs=epochs), {"pro": range(2)}, answering([
            {"loss": 0.4, "tokens": 10.0, "clip_fraction": 0.0, "approx_kl": 0.0, "grad_norm": 1.0},
            {"loss": 0.2, "tokens": 10.0, "clip_fraction": 0.5, "approx_kl": 0.02, "grad_norm": 3.0}]))

    row = update(2)
    assert row["pro/clip_fraction"] == pytest.approx(0.25) and row["pro/grad_norm"] == 2.0
    assert (row["pro/epoch1/clip_fraction"], row["pro/epoch2/clip_fraction"]) == (0.0, 0.5)
    assert row["pro/epoch2/approx_kl"] == 0.02
    assert not [k for k in update(1) if "epoch" in k]
