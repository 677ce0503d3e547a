"""The debate demo's episodes through the engine, against the same engine serving one request at a time.

In one run, on the default model: the debate recipe (two debaters with their own adapters and a
judge) runs the same episodes, seeds and token budgets through the whole orchestrator, once with
the engine batching across episodes and roles (the default) and once with ``max_batch=1``
(requests served one after another: what rolecast would do without the batched engine). The
two alternate ``--repeats`` times; wall times and generated tokens are summed per side.

    python benchmarks/debate.py [--episodes 8] [--repeats 1]
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

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "debate.yaml"


async def one_run(team, loaded, max_batch: int, episodes: int, out: Path) -> tuple[int, float, float]:
    engine = HFEngine(loaded, max_batch=max_batch)
    policies = build_policies(team, {}, lambda: engine)
    try:
        result = await run_team(team, policies, RunOptions(episodes=episodes, seed=0, out_dir=out, progress=False))
    finally:
        await engine.aclose()
    s = result.summary
    return s["generated_tokens"], s["wall_s"], s["valid_turn_rate"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    team = load_team(RECIPE)
    loaded = load_model(args.model)
    totals = {"batched": [0, 0.0], "one_at_a_time": [0, 0.0]}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for side, max_batch in (("batched", 64), ("one_at_a_time", 1)):
                tokens, wall, valid = asyncio.run(one_run(team, loaded, max_batch, args.episodes, Path(tmp) / f"{side}{r}"))
                totals[side][0] += tokens
                totals[side][1] += wall
                print(f"{side}: {tokens} tokens in {wall:.1f}s, valid turns {valid}", file=sys.stderr)
    (bt, bw), (st, sw) = totals["batched"], totals["one_at_a_time"]
    print(json.dumps({
        "model": args.model, "dtype": str(loaded.dtype).removeprefix("torch."), "episodes": args.episodes,
        "repeats": args.repeats, "batched_s": round(bw / args.repeats, 2), "one_at_a_time_s": round(sw / args.repeats, 2),
        "batched_tok_s": round(bt / bw, 1), "one_at_a_time_tok_s": round(st / sw, 1),
        "speedup": round((bt / bw) / (st / sw), 2),
    }))


if __name__ == "__main__":
    main()
