"""The cost of stop strings: the HF engine on the same requests, with stop strings and without.

Every reply runs to its full length (``ignore_eos``, ``--max-tokens`` tokens) and the stop strings
never occur in it, so both sides sample the same tokens (``same_tokens``); what differs is the
engine looking for the strings after each token. ``ratio`` is tokens/s with them over tokens/s
without: the engine decodes a reply's tail to look, where it decoded the whole reply every step.
The two alternate in rounds, so load from elsewhere on the machine hits both alike.

    python benchmarks/stop_strings.py [--model smollm2-135m] [--requests 32] [--max-tokens 512] [--stops 4] [--rounds 3] [--smoke]

``--smoke``: the tiny random model, 4 requests of 16 tokens, one round: seconds, to check that
the script still runs (tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from orchestrator.cli.flags import positive_int
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.engines.hf import HFEngine
from orchestrator.models import load_model

PROMPTS = ["Tell me a long story about a lighthouse keeper.", "Explain how tides work, in detail.",
           "Write a letter to a friend about your garden.", "Describe a day in a busy kitchen."]


def stop_strings(n: int) -> tuple[str, ...]:
    """``n`` strings no reply holds (checked: ``same_tokens``), of a usual stop string's length."""
    return tuple(f"\x00END-{i}\x00" for i in range(n))


async def generate(engine: HFEngine, prompts: list[tuple[int, ...]], max_tokens: int, stop: tuple[str, ...]) -> tuple[float, list]:
    requests = [GenerationRequest(p, SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True,
                                                    seed=i, stop=stop)) for i, p in enumerate(prompts)]
    started = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(r) for r in requests))
    return time.perf_counter() - started, [o.token_ids for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--requests", type=positive_int, default=32)
    parser.add_argument("--max-tokens", type=positive_int, default=512)
    parser.add_argument("--stops", type=positive_int, default=4, help="stop strings a request (OpenAI allows 4)")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.requests, args.max_tokens, args.rounds = "tiny", 4, 16, 1
    loaded = load_model(args.model, dtype=args.dtype)
    engine = HFEngine(loaded)
    prompts = [tuple(engine.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]))
               for i in range(args.requests)]
    # warm-up: first-call costs on neither side, and both read the prompts from the prefix cache (in
    # bf16 a cached prompt's keys differ from a computed one's in the last bits: other tokens)
    asyncio.run(generate(engine, prompts, 4, ()))
    seconds = {"plain": 0.0, "stop": 0.0}
    tokens: dict[str, list] = {}
    for _ in range(args.rounds):
        for side, stop in (("plain", ()), ("stop", stop_strings(args.stops))):
            took, tokens[side] = asyncio.run(generate(engine, prompts, args.max_tokens, stop))
            seconds[side] += took
    generated = args.rounds * sum(len(t) for t in tokens["plain"])
    rates = {side: generated / s for side, s in seconds.items()}
    print(json.dumps({
        "model": args.model, "dtype": str(loaded.dtype).removeprefix("torch."), "requests": args.requests,
        "max_tokens": args.max_tokens, "stops": args.stops, "rounds": args.rounds,
        "plain_tok_s": round(rates["plain"], 1), "stop_tok_s": round(rates["stop"], 1),
        "ratio": round(rates["stop"] / rates["plain"], 3), "same_tokens": tokens["plain"] == tokens["stop"],
    }))


if __name__ == "__main__":
    main()
