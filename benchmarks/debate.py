"""The debate demo's episodes through the engine, against the same engine serving one request at a time.

In one run, on the default model: the debate recipe (two debaters with their own adapters and a
judge) runs the same episodes, seeds and token budgets through the whole orchestrator, once with
the engine batching across episodes and roles (the default) and once with ``max_batch=1``
(requests served one after another: what rolecast would do without the batched engine). The
two alternate ``--repeats`` times after one untimed warm-up episode; wall times and generated
tokens are summed per side.

    python benchmarks/debate.py [--model smollm2-135m] [--episodes 8] [--repeats 1] [--smoke]

``--smoke``: the tiny random model, one episode, the recipe's own budgets (at most 128 tokens a
reply): seconds, to check that the script still runs (tests/test_benchmarks.py).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from _recipes import in_turn, parse_args, run_recipe, warm_up

from orchestrator.models import load_model
from orchestrator.team import load_team

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "debate.yaml"


def main() -> None:
    args = parse_args("repeats", default_episodes=8, default_repeats=1, smoke_episodes=1)

    team = load_team(RECIPE)
    loaded = load_model(args.model)
    totals = {"batched": [0, 0.0], "one_at_a_time": [0, 0.0]}
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(team, loaded, Path(tmp) / "warm-up")
        for r in range(args.repeats):
            for side, max_batch in in_turn((("batched", 64), ("one_at_a_time", 1)), r):
                result, _ = run_recipe(team, loaded, args.episodes, Path(tmp) / f"{side}{r}", max_batch=max_batch)
                s = result.summary
                totals[side][0] += s["generated_tokens"]
                totals[side][1] += s["wall_s"]
                print(f"{side}: {s['generated_tokens']} tokens in {s['wall_s']:.1f}s, valid turns {s['valid_turn_rate']}",
                      file=sys.stderr)
    (bt, bw), (st, sw) = totals["batched"], totals["one_at_a_time"]
    print(json.dumps({
        "model": args.model, "dtype": str(loaded.dtype).removeprefix("torch."), "episodes": args.episodes,
        "repeats": args.repeats, "batched_s": round(bw / args.repeats, 2), "one_at_a_time_s": round(sw / args.repeats, 2),
        "batched_tok_s": round(bt / bw, 1), "one_at_a_time_tok_s": round(st / sw, 1),
        "speedup": round((bt / bw) / (st / sw), 2),
    }))


if __name__ == "__main__":
    main()
