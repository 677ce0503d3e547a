"""Multi-turn rollouts with and without the engine's prefix cache, on the default model.

Guess the Number (recipes/guess_number.yaml): the guesser keeps its conversation, so each turn's
prompt continues the last one token for token, and every episode opens with the same prompt.
The same episodes (seeds, secrets, budgets) run through the whole orchestrator on three engines:
``cached`` (the default: the prefix cache, and newcomers' common prefixes computed once),
``unshared`` (the cache, but newcomers admitted together each prefill their common opening
themselves) and ``uncached`` (neither). The sides alternate ``--rounds`` times after one untimed
warm-up episode, and wall times and prompt tokens computed are summed per side.

    python benchmarks/prefix_cache.py [--model smollm2-135m] [--episodes 32] [--rounds 2] [--smoke]

``--smoke``: the tiny random model, 2 episodes, one round: seconds, to check that the script
still runs (tests/test_benchmarks.py); the guesser's budget is 12 tokens already.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from _recipes import in_turn, parse_args, run_recipe, warm_up

from orchestrator.models import load_model
from orchestrator.team import load_team

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "guess_number.yaml"


def main() -> None:
    args = parse_args("rounds", default_episodes=32, default_repeats=2, smoke_episodes=2)

    team = load_team(RECIPE)
    loaded = load_model(args.model)
    sides = {"cached": {}, "unshared": {"share_prefixes": False}, "uncached": {"prefix_cache_tokens": 0}}
    totals = {side: {"wall_s": 0.0, "prefill_tokens": 0, "hit_tokens": 0, "generated": 0, "turns": 0} for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(team, loaded, Path(tmp) / "warm-up")
        for r in range(args.rounds):
            for side, options in in_turn(list(sides.items()), r):
                result, stats = run_recipe(team, loaded, args.episodes, Path(tmp) / f"{side}{r}",
                                           concurrency=args.episodes, **options)
                row = {"wall_s": result.summary["wall_s"], "prefill_tokens": stats.prefill_tokens,
                       "hit_tokens": stats.prefix_hit_tokens, "generated": result.summary["generated_tokens"],
                       "turns": sum(len(e.turns) for e in result.episodes)}
                for k, v in row.items():
                    totals[side][k] += v
                print(f"round {r} {side}: {row}", file=sys.stderr)
    c, s, u = totals["cached"], totals["unshared"], totals["uncached"]
    print(json.dumps({
        "model": args.model, "dtype": str(loaded.dtype).removeprefix("torch."), "episodes": args.episodes,
        "rounds": args.rounds, "cached": c, "unshared": s, "uncached": u,
        "same_turns": c["turns"] == s["turns"] == u["turns"], "speedup": round(u["wall_s"] / c["wall_s"], 2),
        "prefill_tokens_ratio": round(c["prefill_tokens"] / u["prefill_tokens"], 3),
        "sharing_speedup": round(s["wall_s"] / c["wall_s"], 2),
        "sharing_prefill_tokens_ratio": round(c["prefill_tokens"] / s["prefill_tokens"], 3),
    }))


if __name__ == "__main__":
    main()
