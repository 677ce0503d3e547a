"""Several adapters' training passes computed together (``ServiceClient(joint_passes=True)``:
micro-batches hold several adapters' datums, each row through its own adapter) against a pass per
adapter, on real steps' datums: the same ``forward_backward_many`` call either way.

Two workloads, rolled out once on the engine (the same model):

- ``population``: Rock-Paper-Scissors episodes (recipes/rps.yaml) dealt to four adapters by
  episode, as a population of four members each trains on its own games;
- ``team``: Code Pair (recipes/code_pair.yaml), the Tester's and the Coder's datums, each role
  its own adapter, as every team recipe trains.

Both sides run the workload's calls (PPO, no optimizer step, so they see the same weights),
alternating ``--rounds`` times on one service; the median seconds per side are compared.
``max_logprob_diff`` checks the sides agree; ``rebatched_max_logprob_diff`` is the same
comparison between two pass-per-adapter runs batched differently (a smaller micro-batch
budget), the noise floor of the run's dtype (bf16 autocast on a CPU that has it; in fp32 the
sides agree to 1e-5: tests/training/test_joint_passes.py).

    python benchmarks/joint_passes.py [--model smollm2-135m] [--device auto] [--episodes 16] [--rounds 3] [--smoke]

The episodes roll out on the CPU; ``--device`` places the passes (a GPU's passes are where one
launch sequence for every adapter should count most).

``--smoke``: the tiny random model, 4 episodes, one round: seconds, to check that the script
still runs (tests/test_benchmarks.py).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _recipes import in_turn, max_diff, parse_args, role_datums_of_step

from orchestrator.models import load_model, resolve_device
from orchestrator.training import LoraConfig, ServiceClient

MEMBERS = 4


def workloads(loaded, episodes: int, tmp: Path) -> dict[str, dict[str, list]]:
    """adapter -> datums, per workload."""
    rps = role_datums_of_step("rps", loaded, episodes, tmp / "rps")
    games = [d for per_episode in zip(*rps.values()) for d in per_episode]  # per episode, both seats' datums
    population = {f"member-{m}": [d for data in games[m::MEMBERS] for d in data] for m in range(MEMBERS)}
    team = {role: [d for data in per_episode for d in data]
            for role, per_episode in role_datums_of_step("code_pair", loaded, episodes, tmp / "code_pair").items()}
    return {"population": population, "team": team}


def main() -> None:
    args = parse_args("rounds", default_episodes=16, default_repeats=3, smoke_episodes=4, device=True)
    loaded = load_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        loads = workloads(loaded, args.episodes, Path(tmp))
    service = ServiceClient(args.model, device=resolve_device(args.device))
    report: dict = {"model": args.model, "device": str(service.device), "episodes": args.episodes, "rounds": args.rounds,
                    "autocast_bf16": service.autocast}
    for name, by_adapter in loads.items():
        clients = {a: service.create_lora_training_client(f"{name}/{a}", LoraConfig(rank=16)) for a in by_adapter}
        calls = [(clients[a], data, "ppo", {}) for a, data in by_adapter.items() if data]

        def run(joint: bool) -> list:
            service.joint_passes = joint
            return service.forward_backward_many(calls).result()

        def zero() -> None:
            for c in clients.values():
                c.optimizer.zero_grad(set_to_none=True)

        run(True)  # warm-up: first-call costs on neither side
        zero()
        seconds: dict[str, list[float]] = {"apart": [], "together": []}
        logprobs: dict[str, list] = {}
        for r in range(args.rounds):
            for side, joint in in_turn((("together", True), ("apart", False)), r):
                t0 = time.perf_counter()
                outs = run(joint)
                seconds[side].append(time.perf_counter() - t0)
                zero()
                logprobs[side] = [o["logprobs"] for out in outs for o in out.loss_fn_outputs]
                print(f"{name} round {r} {side}: {seconds[side][-1]:.2f} s", file=sys.stderr)
        budget, service.micro_batch_tokens = service.micro_batch_tokens, service.micro_batch_tokens // 4
        rebatched = [o["logprobs"] for out in run(False) for o in out.loss_fn_outputs]
        zero()
        service.micro_batch_tokens = budget
        apart_s, together_s = statistics.median(seconds["apart"]), statistics.median(seconds["together"])
        report[name] = {
            "adapters": len(calls), "datums": sum(len(d) for _, d, _, _ in calls),
            "tokens": sum(x.model_input.length for _, d, _, _ in calls for x in d),
            "apart_s": round(apart_s, 2), "together_s": round(together_s, 2), "speedup": round(apart_s / together_s, 2),
            "max_logprob_diff": max_diff(logprobs["together"], logprobs["apart"]),
            "rebatched_max_logprob_diff": max_diff(rebatched, logprobs["apart"]),
        }
    service.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
