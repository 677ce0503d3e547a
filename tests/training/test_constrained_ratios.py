"""Constrained sampling and training agree: the trainer applies the sampler's grammar masks, so
on the first, on-policy pass every importance ratio is 1 (docs/constrained.md)."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.messages import schema_json
from orchestrator.training import LoraConfig, ServiceClient
from orchestrator.training.datums import role_datums
from orchestrator.transcript import Attempt, EpisodeRecord, Turn
from support import tiny_engine

VERDICT = schema_json({"type": "object", "properties": {
    "verdict": {"enum": ["approve", "request_changes"]},
    "comments": {"type": "array", "items": {"type": "string"}, "maxItems": 2}}, "required": ["verdict"]})
MOVE = schema_json({"type": "object", "properties": {"move": {"enum": ["rock", "paper", "scissors"]}}, "required": ["move"]})
ARGUMENT = schema_json({"type": "object", "properties": {"argument": {"type": "string", "minLength": 1}}, "required": ["argument"]})
T = 0.8


@pytest.fixture(scope="module")
def episode():
    """One role's attempts from the engine: constrained with a prefix, closed by force, a retry
    that extends the first prompt (merged into one sequence), a free one, and a small language
    sampled in the tokenizer's own spellings (grammar/spelling.py)."""
    engine = tiny_engine()
    chat = engine.apply_chat_template([{"role": "user", "content": "Review this change, in JSON."}])

    async def attempt(prompt, schema, prefix="", max_tokens=24, seed=0):
        prompt = prompt + engine.encode(prefix)
        out = await engine.generate(GenerationRequest(tuple(prompt), SamplingParams(T, 1.0, max_tokens, (), seed),
                                                      json_schema=schema, reply_prefix=prefix if schema else ""))
        return Attempt(messages=[], text=prefix + out.text, valid=False, errors=[], prompt_ids=prompt,
                       token_ids=out.token_ids, logprobs=out.logprobs, json_schema=schema,
                       reply_prefix=prefix if schema else "", forced_tokens=out.forced_tokens, spelled=out.spelled)

    async def play():
        first = await attempt(chat, VERDICT, '{"verdict": "', seed=1)
        retry_prompt = first.prompt_ids + first.token_ids + engine.encode("Again, please.")
        retry = await attempt(retry_prompt, VERDICT, seed=2)
        forced = await attempt(chat, ARGUMENT, max_tokens=8, seed=3)
        free = await attempt(chat, None, seed=4)
        move = await attempt(chat, MOVE, '{"move": "', seed=5)
        await engine.aclose()
        return [first, retry, forced, free, move]

    attempts = asyncio.run(play())
    assert attempts[2].forced_tokens > 0  # the budget closed that one
    ep = EpisodeRecord(id="e", index=0, team="t", task={}, seed=0)
    for i, a in enumerate(attempts):
        ep.turns.append(Turn(turn=i, role="critic", message_id=f"e:{i}", content=None, valid=True, retries=0,
                             penalty=0.0, attempts=[a]))
    return ep


@pytest.fixture(scope="module")
def client():
    service = ServiceClient("tiny", bf16_autocast=False)
    yield service.create_lora_training_client("critic", LoraConfig(rank=4))  # B = 0: the sampler's weights
    service.close()


def test_on_policy_ratios_are_one_under_grammar_masks(episode, client):
    data = role_datums(episode, "critic", advantage=1.0)
    assert [len(d.grammar) for d in data] == [2, 1, 0, 1]  # the retry merged into the first sequence
    assert data[3].grammar[0].spelled
    forced = data[1]
    n_forced = episode.turns[2].attempts[0].forced_tokens
    assert forced.loss_fn_inputs["mask"][-n_forced:] == [0.0] * n_forced  # observations, not actions

    out = client.forward_backward(data, "importance_sampling", {"temperature": T}).result()
    assert out.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and torch.isfinite(torch.tensor(out.metrics["loss"]))
    for d, result in zip(data, out.loss_fn_outputs):
        mask = d.mask() > 0
        sampled = torch.tensor(d.loss_fn_inputs["logprobs"])[mask]
        assert torch.allclose(result["logprobs"][mask], sampled, atol=1e-4)


def test_without_the_masks_the_ratios_are_not_one(episode, client):
    data = [dataclasses.replace(d, grammar=()) for d in role_datums(episode, "critic", advantage=1.0)[:2]]
    out = client.forward(data, "importance_sampling", {"temperature": T}).result()
    gaps = [float((r["logprobs"] - torch.tensor(d.loss_fn_inputs["logprobs"]))[d.mask() > 0].abs().max())
            for d, r in zip(data, out.loss_fn_outputs)]
    assert min(gaps) > 0.1  # unmasked logprobs are lower: the recorded ones are of the masked policy


def test_a_sampler_that_did_not_cut_to_spellings_is_replayed_without_the_cut(episode, client):
    """vLLM takes a grammar, not a mask: its spans say spelled=False and replay the grammar alone.
    Replaying the HF engine's spelled sample that way gives other logprobs: the flag matters."""
    (move,) = role_datums(episode, "critic", advantage=1.0)[3:]
    uncut = dataclasses.replace(move, grammar=tuple(dataclasses.replace(g, spelled=False) for g in move.grammar))
    out = client.forward([move, uncut], "importance_sampling", {"temperature": T}).result()
    mask = move.mask() > 0
    sampled = torch.tensor(move.loss_fn_inputs["logprobs"])[mask]
    assert torch.allclose(out.loss_fn_outputs[0]["logprobs"][mask], sampled, atol=1e-4)
    assert float((out.loss_fn_outputs[1]["logprobs"][mask] - sampled).abs().max()) > 0.1
