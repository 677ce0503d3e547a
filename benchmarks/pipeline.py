"""Orchestrator throughput: a 4-role pipeline with zero-latency Python policies.

Everything but the model runs: prompt rendering, tolerant JSON extraction, schema validation,
routing through the pipeline (with a review loop), transcript records and the JSONL writes.
The baseline, measured in the same run, is the bare cost of extracting and validating the same
replies in a loop; `validation_share` is the fraction of the run's time that this floor takes.

    python benchmarks/pipeline.py [--episodes 2000] [--concurrency 64] [--smoke]

``--smoke``: 20 episodes, 8 at a time: seconds, to check that the script still runs
(tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path


from orchestrator.cli.flags import positive_int
from orchestrator.messages import parse_message
from orchestrator.policies.python import PythonPolicy
from orchestrator.rollout import RunOptions, run_team
from orchestrator.team import load_team

TEAM = """
name: bench_pipeline
protocol:
  type: pipeline
  order: [planner, coder, reviewer, tester]
  loop_back: {from: reviewer, to: coder, field: verdict, values: [request_changes]}
  max_rounds: 2
roles: [{use: planner}, {use: coder}, {use: reviewer}, {use: tester}]
tasks: [{text: "Fix the off-by-one in total()."}, {text: "Handle an empty list in mean()."}]
"""

REPLIES = {
    "planner": '{"summary": "loop skips last item", "files": ["cart.py"], "steps": ["fix bound", "add test"]}',
    "coder": 'Here:\n```json\n{"edits": [{"path": "cart.py", "search": "n - 1", "replace": "n"}]}\n```',
    "reviewer_first": '{"verdict": "request_changes", "comments": ["also handle empty carts"]}',
    "reviewer": '{"verdict": "approve"}',
    "tester": '{"path": "tests/test_cart.py", "code": "def test_total():\\n    assert total([1]) == 1\\n"}',
}


def reply(request) -> str:
    if request.role == "reviewer":
        return REPLIES["reviewer_first" if request.context["round"] == 1 else "reviewer"]
    return REPLIES[request.role]


def bare_validation_rate(team, n: int) -> float:
    """Messages per second for only extract + validate, the floor any orchestrator pays."""
    pairs = [(text, team.roles[key.removesuffix("_first")].validator) for key, text in REPLIES.items()]
    t0 = time.perf_counter()
    for i in range(n):
        text, validator = pairs[i % len(pairs)]
        content, errors = parse_message(text, validator)
        assert not errors
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=positive_int, default=2000)
    parser.add_argument("--concurrency", type=positive_int, default=64)
    parser.add_argument("--smoke", action="store_true", help="seconds: does the script still run")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.concurrency = 20, 8
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "team.yaml").write_text(TEAM)
        team = load_team(Path(tmp) / "team.yaml")
        policies = {name: PythonPolicy(reply) for name in team.roles}
        options = RunOptions(episodes=args.episodes, seed=0, out_dir=Path(tmp) / "run",
                             concurrency=args.concurrency, progress=False)
        warm_up = RunOptions(**{**options.__dict__, "episodes": min(50, args.episodes)})
        asyncio.run(run_team(team, policies, warm_up))
        t0 = time.perf_counter()
        result = asyncio.run(run_team(team, policies, options))
        wall = time.perf_counter() - t0
        messages = result.summary["turns"]
        assert result.summary["status"] == {"ok": args.episodes} and result.summary["valid_turn_rate"] == 1.0
        bare = bare_validation_rate(team, messages)
    rate = messages / wall
    out = {
        "episodes": args.episodes,
        "messages": messages,
        "wall_s": round(wall, 3),
        "messages_per_s": round(rate, 1),
        "bare_validate_per_s": round(bare, 1),
        "validation_share": round(rate / bare, 4),  # fraction of the wall time spent in extract + validate
    }
    print(f"{messages} messages in {wall:.2f}s", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
