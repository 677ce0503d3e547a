"""Rollout throughput of the engine, against plain `model.generate`, on the default model.

In one run, same model and dtype, same prompts and token budgets:
  - engine: 64 concurrent requests through HFEngine (continuous batching, one queue);
  - sequential: the same prompts one at a time with `model.generate` (a subset: it is slow;
    tokens per second is what is compared);
  - prefill: a batched forward over the prompts, the roof for tokens per second;
  - mixed adapters: 64 requests spread over 4 LoRA adapters versus all on one adapter.
Generated tokens are counted on both sides (EOS may end a reply early on either).

    python benchmarks/rollout.py [--requests 64] [--max-tokens 64] [--sequential 8]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

# benchmarks/orchestrator.py would shadow the `orchestrator` package when this folder leads sys.path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

from orchestrator.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from orchestrator.engines.hf import HFEngine  # noqa: E402
from orchestrator.models import load_model  # noqa: E402

TOPICS = ["a lighthouse keeper", "a chess tournament", "bread baking", "a lost dog", "the first day of school",
          "a mountain storm", "a broken robot", "a market at dawn", "an old map", "a jazz trio", "a river crossing",
          "a library at night", "a garden in winter", "a train delay", "a kite festival", "a code review"]


def prompts(engine: HFEngine, n: int) -> list[tuple[int, ...]]:
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        detail = " ".join(["Describe the people, the place and what changes by the end."] * (1 + i % 3))
        messages = [{"role": "system", "content": "You are a storyteller who writes vivid, concrete prose."},
                    {"role": "user", "content": f"Tell a short story about {topic}. {detail}"}]
        out.append(tuple(engine.apply_chat_template(messages)))
    return out


async def engine_run(engine: HFEngine, ps, max_tokens: int, adapters=None) -> tuple[int, float]:
    reqs = [GenerationRequest(p, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i),
                              adapters[i % len(adapters)] if adapters else None) for i, p in enumerate(ps)]
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(r) for r in reqs))
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - t0


def sequential_run(model, ps, max_tokens: int, pad_id: int) -> tuple[int, float]:
    tokens, t0 = 0, time.perf_counter()
    for p in ps:
        ids = torch.tensor([p])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 max_new_tokens=max_tokens, pad_token_id=pad_id)
        tokens += out.shape[1] - ids.shape[1]
    return tokens, time.perf_counter() - t0


def prefill_rate(model, ps, batch: int = 8) -> float:
    tokens, t0 = 0, time.perf_counter()
    for start in range(0, len(ps), batch):
        chunk = ps[start:start + batch]
        width = max(len(p) for p in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(chunk):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
        tokens += int(mask.sum())
    return tokens / (time.perf_counter() - t0)


def randomize(engine: HFEngine, name: str, seed: int, rank: int = 16) -> None:
    """Random non-zero rank-16 LoRA weights on every linear layer (PEFT key format)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for module, m in engine.lora.linears.items():
        state[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, m.in_features, generator=g) * 0.02
        state[f"base_model.model.{module}.lora_B.weight"] = torch.randn(m.out_features, rank, generator=g) * 0.02
    engine.update_adapter(name, state, scale=2.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--sequential", type=int, default=8, help="prompts timed one at a time")
    args = parser.parse_args()

    loaded = load_model(args.model, dtype=args.dtype)
    engine = HFEngine(loaded, max_batch=args.requests)
    ps = prompts(engine, args.requests)

    async def measure():
        await engine_run(engine, ps[:4], 4)  # warm-up
        eng = await engine_run(engine, ps, args.max_tokens)
        print(f"engine: {eng[0]} tokens in {eng[1]:.1f}s", file=sys.stderr)
        seq = sequential_run(loaded.model, ps[: args.sequential], args.max_tokens, loaded.tokenizer.pad_token_id)
        print(f"sequential: {seq[0]} tokens in {seq[1]:.1f}s", file=sys.stderr)
        prefill = prefill_rate(loaded.model, ps)
        names = [f"role{i}" for i in range(4)]
        for i, name in enumerate(names):
            engine.add_adapter(name)
            randomize(engine, name, i)
        one = await engine_run(engine, ps, args.max_tokens, names[:1])
        mixed = await engine_run(engine, ps, args.max_tokens, names)
        print(f"one adapter: {one[0]} in {one[1]:.1f}s; four adapters: {mixed[0]} in {mixed[1]:.1f}s", file=sys.stderr)
        await engine.aclose()
        return eng, seq, prefill, one, mixed

    eng, seq, prefill, one, mixed = asyncio.run(measure())
    engine_tok_s, sequential_tok_s = eng[0] / eng[1], seq[0] / seq[1]
    print(json.dumps({
        "model": args.model, "dtype": str(loaded.dtype).removeprefix("torch."), "requests": args.requests,
        "max_tokens": args.max_tokens, "sequential_prompts": args.sequential,
        "engine_tok_s": round(engine_tok_s, 1), "sequential_tok_s": round(sequential_tok_s, 1),
        "ratio": round(engine_tok_s / sequential_tok_s, 2), "prefill_tok_s": round(prefill, 1),
        "decode_vs_prefill": round(engine_tok_s / prefill, 3),
        "one_adapter_tok_s": round(one[0] / one[1], 1), "mixed_adapter_tok_s": round(mixed[0] / mixed[1], 1),
        "mixed_adapter_ratio": round((mixed[0] / mixed[1]) / (one[0] / one[1]), 3),
    }))


if __name__ == "__main__":
    main()
