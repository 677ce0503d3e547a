"""Rollout throughput of the engine, against plain `model.generate`, on the default model.

In one run, same model and dtype, same prompts and token budgets:
  - engine: 64 concurrent requests through HFEngine (continuous batching, one queue);
  - sequential: the same prompts one at a time with `model.generate` (a subset: it is slow;
    tokens per second is what is compared);
  - prefill: a batched forward over the prompts, the roof for tokens per second; the engine's
    decode rate (its decode steps' tokens over their seconds, from ``HFEngine.stats``: the
    engine's own prefill of the prompts left out) is compared with it (``decode_vs_prefill``),
    and its end-to-end rate too (``engine_vs_prefill``);
  - decode path: the same engine run again, stepping through transformers' forward instead of
    its fused decode step (``engines/decoder.py``); ``fused_vs_transformers`` compares decode rates;
  - fallback: the fused step with its weights laid out as on a lesser CPU (``decoder.weight_layout``:
    bf16 weights prepacked as fp32 as on an AVX2-only CPU where this one prepacks bf16, else plain
    weights as without oneDNN); ``fused_vs_fallback`` compares decode rates;
  - mixed adapters: 64 requests spread over 4 LoRA adapters versus all on one adapter.
Generated tokens are counted on both sides (EOS may end a reply early on either). The
``generate`` and prefill sides run on a second copy of the model, loaded alike and untouched by
the engine (which hooks its LoRA stacks into every linear layer and swaps in its decode attention).

Every side runs once per round (``--rounds``) and the totals are compared, so the machine's slow
spells hit all sides alike.

    python benchmarks/rollout.py [--model smollm2-135m] [--requests 64] [--max-tokens 64] [--sequential 9]
                                 [--rounds 3] [--smoke]

``--smoke``: the tiny random model (with ``--random-weights``, ``--model``'s shape), 4 requests of
4 tokens, 2 of them sequential, one round: seconds, to check that the script still runs
(tests/test_benchmarks.py; with ``--device cuda``, tests/gpu).

On a GPU (``--device cuda``) the sides are the GPU's own (``gpu_main``):
  - engine: ``--requests`` (256) concurrent requests of ``--max-tokens`` (128) through the engine on
    its static path (static KV cache, steps replayed from CUDA graphs), no adapter; ``one``: all
    on one LoRA adapter; ``mixed``: spread over 4 adapters; ``eager``: the static path with its
    steps launched op by op instead of replayed (what the graphs buy);
  - generate: the same prompts as one batch through ``model.generate``, and through
    ``model.generate(cache_implementation="static")`` (transformers compiles its decode step:
    its best; the compile happens in an untimed first call), both with ``min_new_tokens`` =
    ``max_new_tokens`` so every row generates the full budget;
  - next turns (``next_turns``): multi-turn admissions, a short rest after a cached prefix, with
    the static path's prefill through its fused step and through transformers' forward.
``--random-weights``: the model's shape with random weights (``--model`` a dir with its config
and tokenizer): they rarely sample EOS, so the engine's rows run their full budget too, and
generated tokens are counted on every side.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time

import torch
from _recipes import TOPICS

from orchestrator.cli.flags import positive_int
from orchestrator.compute_thread import compute_thread
from orchestrator.cpu import CpuFeatures, host
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.engines.decoder import weight_layout
from orchestrator.engines.graphs import count_kernels
from orchestrator.engines.hf import EngineStats, HFEngine
from orchestrator.models import load_model



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


def prefill_run(model, ps, batch: int = 8) -> tuple[int, float]:
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
    return tokens, time.perf_counter() - t0


def randomize(engine: HFEngine, name: str, seed: int, rank: int = 16) -> None:
    """Random non-zero rank-16 LoRA weights on every linear layer (PEFT key format)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for module, m in engine.lora.linears.items():
        state[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, m.in_features, generator=g) * 0.02
        state[f"base_model.model.{module}.lora_B.weight"] = torch.randn(m.out_features, rank, generator=g) * 0.02
    engine.update_adapter(name, state, scale=2.0)


def lesser_cpu(dtype: torch.dtype) -> CpuFeatures:
    """A CPU whose fused-step layout is the next one down from this machine's."""
    if weight_layout(dtype)[0] == "onednn" and dtype == torch.bfloat16:
        return CpuFeatures(frozenset({"avx2", "fma"}))  # onednn-fp32, as on an AVX2-only EPYC
    return CpuFeatures(host().flags, onednn=False)  # plain weights


def random_model(folder: str, dtype: str, device: torch.device):
    """``folder``'s model shape (config and tokenizer) with seeded random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from orchestrator.models import LoadedModel, resolve_dtype

    torch_dtype = resolve_dtype(dtype, device)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch_dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model=model, tokenizer=tokenizer, name=folder, dtype=torch_dtype)


def batch_generate(model, ps, max_tokens: int, pad_id: int, **options) -> tuple[int, float]:
    """All prompts as one left-padded batch through ``model.generate``, every row ``max_tokens`` long."""
    width = max(len(p) for p in ps)
    ids = torch.full((len(ps), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(ps):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, pad_token_id=pad_id, **options)
    torch.cuda.synchronize()
    return (out.shape[1] - width) * len(ps), time.perf_counter() - t0


def engine_with_adapters(loaded, requests: int) -> tuple[HFEngine, list[tuple[int, ...]], list[str]]:
    """The engine under test, its prompts, and 4 adapters with random weights. No prefix cache:
    every side prefills its prompts in full each round, as plain `generate` does
    (benchmarks/prefix_cache.py measures the cache)."""
    engine = HFEngine(loaded, max_batch=requests, prefix_cache_tokens=0)
    names = [f"role{i}" for i in range(4)]
    for i, name in enumerate(names):
        engine.add_adapter(name)
        randomize(engine, name, i)
    return engine, prompts(engine, requests), names


def step_kernels(engine: HFEngine, rows: int, window: int) -> dict[str, int]:
    """The kernels one static decode step of ``rows`` x ``window`` launches (``graphs.count_kernels``),
    with no adapter, one, and mixed: what its graphs replay. Run eagerly (the step writes only the
    idle slots' column 0 once the requests are done)."""
    with torch.inference_mode():
        return {mode: sum(count_kernels(lambda: engine._static_forward(rows, window, mode)).values())
                for mode in ("none", "one", "mixed")}


async def next_turns(engine: HFEngine, ps, rounds: int) -> dict[str, float]:
    """A multi-turn episode's next turn is a short rest after a prompt the prefix cache holds: ms
    per admission of such turns (``max_tokens`` 1: the prefill and its first token), ``len(ps)``
    rows at once and one row at a time, with the static path's prefill through the fused step and
    through transformers' forward, alternating. Each round first runs the conversations' opening
    turns (8 new tokens each), then times their next turns: the reply and 9 new tokens."""
    timed: dict[str, list[float]] = {}
    for r in range(rounds):
        for fused in (True, False) if r % 2 == 0 else (False, True):
            engine.fused_prefill = fused
            side = "fused" if fused else "transformers"
            opening = await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(max_tokens=8, seed=i)))
                                             for i, p in enumerate(ps)))
            turns = [GenerationRequest(p + tuple(o.token_ids) + tuple(range(1000 + 16 * r, 1009 + 16 * r)),
                                       SamplingParams(max_tokens=1, seed=i)) for i, (p, o) in enumerate(zip(ps, opening))]
            t0 = time.perf_counter()
            await asyncio.gather(*(engine.generate(t) for t in turns[1:]))
            timed.setdefault(f"{side}_{len(ps) - 1}_rows", []).append(1e3 * (time.perf_counter() - t0))
            t0 = time.perf_counter()
            await engine.generate(turns[0])
            timed.setdefault(f"{side}_1_row", []).append(1e3 * (time.perf_counter() - t0))
    return {k: round(sorted(v)[len(v) // 2], 2) for k, v in timed.items()}


def gpu_main(args, loaded, plain) -> None:
    engine, ps, names = engine_with_adapters(loaded, args.requests)
    compute = compute_thread()
    pad = loaded.tokenizer.pad_token_id
    sides = ("engine", "one", "mixed", "eager", "generate", "static_generate")
    totals = {k: [0, 0.0] for k in sides}

    def add(key, tokens, seconds):
        totals[key][0] += tokens
        totals[key][1] += seconds

    async def measure():
        # untimed: captures the graphs every side below replays, and compiles static generate's step
        for adapters in (None, names[:1], names):
            await engine_run(engine, ps, args.max_tokens, adapters)
        static = functools.partial(batch_generate, plain.model, ps, args.max_tokens, pad, cache_implementation="static")
        compute.submit(static).result()
        for r in range(args.rounds):
            add("engine", *await engine_run(engine, ps, args.max_tokens))
            add("one", *await engine_run(engine, ps, args.max_tokens, names[:1]))
            add("mixed", *await engine_run(engine, ps, args.max_tokens, names))
            engine.cuda_graphs = False
            add("eager", *await engine_run(engine, ps, args.max_tokens))
            engine.cuda_graphs = True
            add("generate", *compute.submit(batch_generate, plain.model, ps, args.max_tokens, pad).result())
            add("static_generate", *compute.submit(static).result())
            print(f"round {r}: " + ", ".join(f"{k} {t} tok in {s:.2f}s" for k, (t, s) in totals.items()), file=sys.stderr)
        engine.stats = EngineStats()
        await engine_run(engine, ps, args.max_tokens, names)
        stats.update(engine.stats.as_dict())
        window = max(w for _, w, _ in engine._graphs.shapes)
        try:  # a diagnostic: its failure is reported beside the rates, not in their place
            kernels.update(compute.submit(step_kernels, engine, args.requests, window).result())
        except Exception as exc:
            kernels["error"] = f"{type(exc).__name__}: {exc}"
        await engine.aclose()
        multi_turn = HFEngine(loaded, max_batch=args.requests)  # with a prefix cache, unlike the engine above
        turns.update(await next_turns(multi_turn, ps[:33], 4))
        await multi_turn.aclose()

    stats: dict = {}
    kernels: dict = {}
    turns: dict = {}
    asyncio.run(measure())
    rate = {k: t / s for k, (t, s) in totals.items()}
    # one step's GPU time, per captured shape of the full bucket: what the host adds is the rest of a step
    full = [shape for shape in engine._graphs.shapes if shape[0] == args.requests]
    replay_ms = {f"{lora}_{rows}x{window}": round(1e3 * engine._graphs.replay_seconds((rows, window, lora)), 3)
                 for rows, window, lora in full}
    print(json.dumps({
        "model": args.model, "device": torch.cuda.get_device_name(), "dtype": str(loaded.dtype).removeprefix("torch."),
        "requests": args.requests, "max_tokens": args.max_tokens, "rounds": args.rounds, "decode_path": engine.decode_path,
        "graphs_captured": engine._graphs.captured, **{f"{k}_tok_s": round(v, 1) for k, v in rate.items()},
        "mixed_decode_ms_per_step": round(1e3 * stats["decode_s"] / stats["decode_steps"], 3),
        "mixed_prefill_s": stats["prefill_s"], "graph_replay_ms": replay_ms, "kernels_per_step": kernels,
        "engine_vs_static_generate": round(rate["engine"] / rate["static_generate"], 3),
        "one_adapter_vs_static_generate": round(rate["one"] / rate["static_generate"], 3),
        "mixed_vs_static_generate": round(rate["mixed"] / rate["static_generate"], 3),
        "mixed_adapter_ratio": round(rate["mixed"] / rate["one"], 3),
        "graphs_vs_eager": round(rate["engine"] / rate["eager"], 3),
        "static_generate_vs_generate": round(rate["static_generate"] / rate["generate"], 3),
        "next_turn_ms": turns,
        "next_turn_fused_vs_transformers": {rows: round(turns[f"transformers_{rows}"] / turns[f"fused_{rows}"], 3)
                                            for rows in (f"{len(ps[:33]) - 1}_rows", "1_row")},
    }))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU's sides (gpu_main)")
    parser.add_argument("--random-weights", action="store_true", help="--model is a dir: its shape, random weights")
    parser.add_argument("--requests", type=positive_int, default=None, help="concurrent requests (64 on the CPU, 256 on a GPU)")
    parser.add_argument("--max-tokens", type=positive_int, default=None, help="new tokens per request (64 on the CPU, 128 on a GPU)")
    parser.add_argument("--sequential", type=positive_int, default=9, help="prompts timed one at a time (split over rounds)")
    parser.add_argument("--rounds", type=positive_int, default=None, help="every side runs once per round (3 on the CPU, 2 on a GPU)")
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    from orchestrator.models import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        parser.error(f"--device {args.device}: {exc}")
    gpu = device.type == "cuda"
    args.requests = args.requests or (256 if gpu else 64)
    args.max_tokens = args.max_tokens or (128 if gpu else 64)
    args.rounds = args.rounds or (2 if gpu else 3)
    if args.smoke:  # the tiny model, or with --random-weights the given folder's shape
        args.requests, args.max_tokens, args.sequential, args.rounds = 4, 4, 2, 1
        args.model = args.model if args.random_weights else "tiny"

    def load():
        return (random_model(args.model, args.dtype, device) if args.random_weights
                else load_model(args.model, dtype=args.dtype, device=device))

    loaded, plain = load(), load()  # the engine's, and the baselines' copy that no engine hooks into
    if gpu:
        gpu_main(args, loaded, plain)
        return
    engine, ps, names = engine_with_adapters(loaded, args.requests)
    compute = compute_thread()
    # Every side runs once per round, so a slow spell of the machine hits all of them alike.
    totals = {k: [0, 0.0] for k in ("engine", "sequential", "prefill", "one", "mixed")}
    # the fused decode step on this CPU's layout, on a lesser CPU's, and transformers' forward
    # lesser_cpu probes oneDNN: on the compute thread, as every torch op here. One on this thread
    # gives the process a second OpenMP team, and libgomp then stops spinning between parallel
    # regions for good: it cut the engine's decode rate by a third (compute_thread.py).
    lesser = compute.submit(lesser_cpu, loaded.dtype).result()
    sides = {"fused": (True, None), "fallback": (True, lesser), "transformers": (False, None)}
    decode = {side: EngineStats() for side in sides}
    paths = {}

    def add(key, tokens, seconds):
        totals[key][0] += tokens
        totals[key][1] += seconds

    async def measure():
        for r in range(args.rounds):
            for side, (fused, cpu) in sides.items():
                engine.fused_decode, engine.cpu = fused, cpu
                await engine_run(engine, ps[:4], 4)  # untimed: packs the side's weights
                engine.stats = EngineStats()
                tokens_seconds = await engine_run(engine, ps, args.max_tokens)
                if side == "fused":
                    add("engine", *tokens_seconds)
                paths[side] = engine.decode_path
                decode[side].decode_s += engine.stats.decode_s
                decode[side].decode_tokens += engine.stats.decode_tokens
                decode[side].decode_steps += engine.stats.decode_steps
            engine.fused_decode, engine.cpu = True, None
            await engine_run(engine, ps[:4], 4)  # repacked for this CPU before the adapter sides
            # on the compute thread, as the engine: a second thread of torch work would slow every
            # side after it (orchestrator/compute_thread.py)
            add("sequential", *compute.submit(sequential_run, plain.model, ps[r : args.sequential : args.rounds],
                                              args.max_tokens, plain.tokenizer.pad_token_id).result())
            add("prefill", *compute.submit(prefill_run, plain.model, ps).result())
            add("one", *await engine_run(engine, ps, args.max_tokens, names[:1]))
            add("mixed", *await engine_run(engine, ps, args.max_tokens, names))
            print(f"round {r}: " + ", ".join(f"{k} {t} tok in {s:.1f}s" for k, (t, s) in totals.items()), file=sys.stderr)
        await engine.aclose()

    asyncio.run(measure())
    rate = {k: t / s for k, (t, s) in totals.items()}
    decode_rate = {side: d.decode_tokens / d.decode_s for side, d in decode.items()}
    decode_tok_s, transformers_decode_tok_s = decode_rate["fused"], decode_rate["transformers"]
    print(json.dumps({
        "model": args.model, "dtype": str(loaded.dtype).removeprefix("torch."), "requests": args.requests,
        "max_tokens": args.max_tokens, "sequential_prompts": args.sequential,
        "rounds": args.rounds,
        "engine_tok_s": round(rate["engine"], 1), "sequential_tok_s": round(rate["sequential"], 1),
        "ratio": round(rate["engine"] / rate["sequential"], 2), "prefill_tok_s": round(rate["prefill"], 1),
        "decode_path": paths["fused"],
        "decode_tok_s": round(decode_tok_s, 1),
        "decode_rows_per_step": round(decode["fused"].decode_tokens / decode["fused"].decode_steps, 1),
        "decode_vs_prefill": round(decode_tok_s / rate["prefill"], 3),
        "transformers_decode_tok_s": round(transformers_decode_tok_s, 1),
        "fused_vs_transformers": round(decode_tok_s / transformers_decode_tok_s, 3),
        "fallback_path": paths["fallback"], "fallback_decode_tok_s": round(decode_rate["fallback"], 1),
        "fused_vs_fallback": round(decode_tok_s / decode_rate["fallback"], 3),
        "engine_vs_prefill": round(rate["engine"] / rate["prefill"], 3),
        "one_adapter_tok_s": round(rate["one"], 1), "mixed_adapter_tok_s": round(rate["mixed"], 1),
        "mixed_adapter_ratio": round(rate["mixed"] / rate["one"], 3),
    }))


if __name__ == "__main__":
    main()
