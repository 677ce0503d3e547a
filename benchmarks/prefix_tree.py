"""Training passes over real steps' datums, each shared prefix computed once (a prefix tree)
against every datum computed in full.

Two recipes' episodes are rolled out once on the engine (the same model): Rock-Paper-Scissors
(recipes/rps.yaml: the game role re-renders its history every turn, so each turn is a datum of
its own and the turns of all episodes agree up to the first move that differed) and Guess the
Number (recipes/guess_number.yaml: a conversation role, one datum per episode, every episode
opening with the same prompt). Then the same datums go through ``forward_backward`` (PPO, the
recipes' own settings otherwise) with ``ServiceClient.share_prefixes`` on and off, alternating
``--rounds`` times on one service (no optimizer step, so both sides see the same weights), and
the median seconds per side are compared; ``tree_tokens`` counts the tokens the shared side's
passes compute (``computed_tokens``), ``shared_kernels`` and ``plain_kernels`` the
kernels one ``forward_backward`` launches on each side (``graphs.count_kernels``: on a GPU, where
a small model's ops are short, each costs about its launch). ``max_logprob_diff`` checks the two sides agree;
``rebatched_max_logprob_diff`` is the same comparison between two plain passes batched
differently (a smaller micro-batch budget), the noise floor of the run's dtype: under bf16
autocast the two sides agree to that floor, in fp32 to 1e-5 (tests/training/test_losses.py).

    python benchmarks/prefix_tree.py [--model smollm2-135m] [--device auto] [--episodes 16] [--rounds 2] [--smoke]

The episodes roll out on the CPU; ``--device`` places the passes. The tree trades tokens for
passes (a wave of the tree is a pass of its own): on a CPU a pass's fixed cost is worth about 30
tokens (``prefix_tree.RECOMPUTE_TOKENS``), on a GPU, where a small model's passes are bound by
kernel launches, far more; this benchmark on the GPU says which side wins there.

``--smoke``: the tiny random model, 2 episodes, one round: seconds, to check that the script
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

from orchestrator.engines.graphs import count_kernels
from orchestrator.models import load_model, resolve_device
from orchestrator.training import LoraConfig, ServiceClient, prefix_tree


def step_datums(recipe: str, loaded, episodes: int, out: Path) -> list:
    """Every trainable role's datums of ``episodes`` episodes (``role_datums_of_step``)."""
    return [d for per_episode in role_datums_of_step(recipe, loaded, episodes, out).values() for data in per_episode for d in data]


def kernels(service: ServiceClient, client, data: list) -> int:
    """The kernels one forward_backward of ``data`` launches, counted on the compute thread (where
    the client's passes run: a dispatch mode holds for its own thread only), gradients dropped."""
    def count() -> int:
        total = sum(count_kernels(lambda: client._forward(data, "ppo", {}, True)).values())
        client.optimizer.zero_grad(set_to_none=True)
        return total
    return service.submit(count).result()


def computed_tokens(service: ServiceClient, client, data: list) -> int:
    """The tokens the client's passes over ``data`` compute: a tree per micro-batch, short shared
    segments folded into their branches up to the service's ``pass_tokens`` (32 on a CPU, 4,096
    on a GPU, where a GRPO group's prompt is recomputed in each row)."""
    seqs = [d.model_input.tokens for d in data]
    return sum(prefix_tree.build([seqs[i] for i in rows], recompute=service.pass_tokens).tokens
               for rows in service._micro_batches(seqs, [client.name] * len(seqs)))


def main() -> None:
    args = parse_args("rounds", default_episodes=16, default_repeats=2, smoke_episodes=2, device=True)
    loaded = load_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        steps = {name: step_datums(name, loaded, args.episodes, Path(tmp) / name) for name in ("rps", "guess_number")}
    service = ServiceClient(args.model, device=resolve_device(args.device))
    client = service.create_lora_training_client("bench", LoraConfig(rank=16))
    report: dict = {"model": args.model, "device": str(service.device), "episodes": args.episodes, "rounds": args.rounds, "autocast_bf16": service.autocast}
    for name, data in steps.items():
        seconds: dict[bool, list[float]] = {True: [], False: []}
        logprobs: dict[bool, list] = {}
        client.forward_backward(data[:2], "ppo", {}).result()  # warm-up: first-call costs on neither side
        client.optimizer.zero_grad(set_to_none=True)
        for r in range(args.rounds):
            for share in in_turn((True, False), r):
                service.share_prefixes = share
                t0 = time.perf_counter()
                out = client.forward_backward(data, "ppo", {}).result()
                seconds[share].append(time.perf_counter() - t0)
                client.optimizer.zero_grad(set_to_none=True)
                logprobs[share] = [o["logprobs"] for o in out.loss_fn_outputs]
                print(f"{name} round {r} share={share}: {seconds[share][-1]:.2f} s", file=sys.stderr)
        counted = {}
        for share in (True, False):
            service.share_prefixes = share
            counted[share] = kernels(service, client, data)
        service.share_prefixes, budget = False, service.micro_batch_tokens
        service.micro_batch_tokens = budget // 4
        rebatched = [o["logprobs"] for o in client.forward(data, "ppo", {}).result().loss_fn_outputs]
        service.micro_batch_tokens = budget
        tokens = sum(d.model_input.length for d in data)
        service.share_prefixes = True  # the shared side's micro-batches
        tree = computed_tokens(service, client, data)
        shared_s, plain_s = statistics.median(seconds[True]), statistics.median(seconds[False])
        report[name] = {
            "datums": len(data), "tokens": tokens, "tree_tokens": tree,
            "tokens_ratio": round(tree / tokens, 3), "shared_s": round(shared_s, 2), "plain_s": round(plain_s, 2),
            "speedup": round(plain_s / shared_s, 2), "shared_kernels": counted[True], "plain_kernels": counted[False],
            "max_logprob_diff": max_diff(logprobs[True], logprobs[False]),
            "rebatched_max_logprob_diff": max_diff(rebatched, logprobs[False]),
        }
    service.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
