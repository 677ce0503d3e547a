"""The training client's LM head: action-token logprobs, forward and backward, two ways.

``token_logprobs`` (``training/losses.py``) turns the last hidden states of the action positions
into logprobs without a full [positions, vocab] float32 tensor. Through the base model's frozen
head it takes each position's gradient in the forward (``frozen``: the head's matmul twice);
through a head with trainable weights it runs checkpointed chunks (``checkpointed``: the matmul
three times, the chunk's forward again in the backward). Both sides here run the same head
weights (SmolLM2-135M's shape: 576 -> 49,152, random), the same hidden states and targets, and
the same PPO-like per-token weights on the logprobs (and on the entropies with ``--entropy``);
the checkpointed side's weights are marked trainable, and the backward asks for the hidden
states' gradient only, so neither side computes a gradient for the head. Sides alternate over
``--rounds``; each reports the median seconds of its ``--iters`` timed calls after a warm-up.
``ratio`` = checkpointed seconds / frozen seconds (above 1: the frozen head is faster), and
``max_grad_diff`` the largest difference of the two sides' gradients (they are the same maths).

    python benchmarks/logprob_head.py [--device auto] [--positions 2048] [--chunk 512] [--bf16]
                                      [--entropy] [--iters 5] [--rounds 3] [--smoke]

``--smoke``: a 64 -> 512 head, 40 positions, one round of one call: seconds, to check that the
script still runs (tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from orchestrator.cli.flags import non_negative_int, positive_int
from orchestrator.models import bf16_native, resolve_device
from orchestrator.training.client import logprob_chunk
from orchestrator.training.losses import token_logprobs


def timed(device: torch.device, fn) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto (a CUDA GPU where there is one), cpu, cuda, cuda:N")
    parser.add_argument("--positions", type=positive_int, default=2048, help="action positions per call")
    parser.add_argument("--chunk", type=non_negative_int, default=0, help="positions per block of logits (0: the client's)")
    parser.add_argument("--hidden", type=positive_int, default=576)
    parser.add_argument("--vocab", type=positive_int, default=49152)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (the client's setting where bf16 is native)")
    parser.add_argument("--entropy", action="store_true", help="also the entropies, with weights of their own")
    parser.add_argument("--iters", type=positive_int, default=5)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.positions, args.hidden, args.vocab, args.iters, args.rounds = 40, 64, 512, 1, 1
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        sys.exit(f"--device {args.device}: {exc}")
    if args.bf16 and not bf16_native(device):
        print(f"note: {device} has no native bf16; autocast emulates it", file=sys.stderr)
    chunk = args.chunk or logprob_chunk(device)

    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(args.vocab, args.hidden, generator=g) * 0.05)
    head = head.to(device)
    hidden = torch.randn(args.positions, args.hidden, generator=g).to(device).requires_grad_(True)
    targets = torch.randint(0, args.vocab, (args.positions,), generator=g).to(device)
    w_logp = torch.randn(args.positions, generator=g).to(device)
    w_ent = torch.randn(args.positions, generator=g).to(device)

    def call(side: str) -> torch.Tensor:
        head.weight.requires_grad_(side == "checkpointed")  # which path token_logprobs takes
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            out = token_logprobs(hidden, head, targets, chunk=chunk, entropy=args.entropy)
        loss = (w_logp * out[0] + w_ent * out[1]).sum() if args.entropy else (w_logp * out).sum()
        (grad,) = torch.autograd.grad(loss, hidden)  # the hidden states' gradient only, on both sides
        return grad

    seconds: dict[str, list[float]] = {"frozen": [], "checkpointed": []}
    grads = {side: call(side) for side in seconds}  # warm-up, and the gradients compared
    for r in range(args.rounds):
        for side in ("frozen", "checkpointed") if r % 2 == 0 else ("checkpointed", "frozen"):
            for _ in range(args.iters):
                seconds[side].append(timed(device, lambda side=side: call(side)))
            print(f"round {r} {side}: {statistics.median(seconds[side][-args.iters:]):.4f} s", file=sys.stderr)
    med = {side: statistics.median(s) for side, s in seconds.items()}
    print(json.dumps({
        "device": str(device), "positions": args.positions, "hidden": args.hidden, "vocab": args.vocab,
        "chunk": chunk, "bf16": args.bf16, "entropy": args.entropy, "iters": args.iters, "rounds": args.rounds,
        "frozen_s": round(med["frozen"], 5), "checkpointed_s": round(med["checkpointed"], 5),
        "ratio": round(med["checkpointed"] / med["frozen"], 3),
        "max_grad_diff": float((grads["frozen"].float() - grads["checkpointed"].float()).abs().max()),
    }))


if __name__ == "__main__":
    main()
