"""Multi-turn rollouts with and without the engine's prefix cache, on the default model.

Guess the Number (recipes/guess_number.yaml): the guesser keeps its conversation, so each turn's
prompt continues the last one token for token, and every episode opens with the same prompt.
The same episodes (seeds, secrets, budgets) run through the whole orchestrator on an engine with
the prefix cache and on one without; the two alternate ``--rounds`` times, and wall times and
prompt tokens computed are summed per side.

    python benchmarks/prefix_cache.py [--episodes 32] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

# benchmarks/orchestrator.py would shadow the `orchestrator` package when this folder leads sys.path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from orchestrator.engines.hf import HFEngine  # noqa: E402
from orchestrator.models import load_model  # noqa: E402
from orchestrator.runner import RunOptions, build_policies, run_team  # noqa: E402
from orchestrator.team import load_team  # noqa: E402

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "guess_number.yaml"


async def one_run(team, loaded, cache_tokens: int, episodes: int, out: Path) -> dict:
    engine = HFEngine(loaded, prefix_cache_tokens=cache_tokens)
    try:
        result = await run_team(team, build_policies(team, {}, lambda: engine),
                                RunOptions(episodes=episodes, seed=0, out_dir=out, concurrency=episodes, progress=False))
    finally:
        await engine.aclose()
    s = engine.stats
    return {"wall_s": result.summary["wall_s"], "prefill_tokens": s.prefill_tokens, "hit_tokens": s.prefix_hit_tokens,
            "generated": result.summary["generated_tokens"], "turns": sum(len(e.turns) for e in result.episodes)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    team = load_team(RECIPE)
    loaded = load_model(args.model)
    sides = {"cached": 16384, "uncached": 0}
    totals = {side: {"wall_s": 0.0, "prefill_tokens": 0, "hit_tokens": 0, "generated": 0, "turns": 0} for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side, tokens in sides.items():
                row = asyncio.run(one_run(team, loaded, tokens, args.episodes, Path(tmp) / f"{side}{r}"))
                for k, v in row.items():
                    totals[side][k] += v
                print(f"round {r} {side}: {row}", file=sys.stderr)
    c, u = totals["cached"], totals["uncached"]
    print(json.dumps({
        "model": args.model, "dtype": str(loaded.dtype).removeprefix("torch."), "episodes": args.episodes,
        "rounds": args.rounds, "cached": c, "uncached": u,
        "same_turns": c["turns"] == u["turns"], "speedup": round(u["wall_s"] / c["wall_s"], 2),
        "prefill_tokens_ratio": round(c["prefill_tokens"] / u["prefill_tokens"], 3),
    }))


if __name__ == "__main__":
    main()
