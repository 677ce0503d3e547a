"""forward_backward throughput and peak memory: the training client versus a plain PEFT loop.

Both sides compute the same PPO loss on the same batch of the same model (fp32 master weights,
the same autocast setting, the same LoRA config): the plain loop calls the PEFT model, takes
its full [batch, length, vocab] logits to float32 and gathers the targets; the client runs the
transformer, then the LM head and log-softmax a block of positions at a time (``logprob_head.py``). Each side runs in its own
subprocess (so peak memory is its own), alternating, and reports the median.

``--device`` (auto: a CUDA GPU where there is one) places both sides: the client's ServiceClient
and the plain loop's tensors, with bf16 autocast where the device has native bf16. Peak memory
(``*_peak_mb``): on the CPU, the growth of peak RSS (VmHWM) over the RSS after the warm-up step;
on CUDA, ``torch.cuda.max_memory_allocated()`` over the timed steps (after
``torch.cuda.reset_peak_memory_stats()``), so it includes the weights and optimizer state, the
same on both sides.

    python benchmarks/train.py [--model smollm2-135m] [--device auto] [--batch 8] [--length 384] [--iters 3]
                               [--rounds 2] [--smoke]

``--smoke``: the tiny random model, 2 sequences of 16 tokens, one step per side, one round:
seconds (most of it the two workers' imports), to check that the script still runs
(tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.cli.flags import positive_int


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def _batch(batch: int, length: int, vocab: int):
    import torch

    from orchestrator.training.types import Datum, ModelInput

    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(batch):
        toks = torch.randint(100, vocab - 100, (length + 1,), generator=g).tolist()
        mask = [0.0] * (length // 3) + [1.0] * (length - length // 3)
        data.append(Datum(ModelInput.from_ints(toks[:-1]), {
            "target_tokens": toks[1:], "mask": mask,
            "logprobs": [-2.0] * length, "advantages": [0.5 if i % 2 else -0.5 for i in range(length)],
        }))
    return data


def worker(side: str, model: str, batch: int, length: int, iters: int, device: str = "cpu") -> dict:
    import torch

    from orchestrator.models import resolve_device
    from orchestrator.training.client import ServiceClient
    from orchestrator.training.types import LoraConfig

    torch.manual_seed(0)
    dev = resolve_device(device)
    cuda = dev.type == "cuda"
    service = ServiceClient(model, device=dev)
    client = service.create_lora_training_client("bench", LoraConfig(rank=16))
    data = _batch(batch, length, len(service.loaded.tokenizer))
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "aggregation": "token-mean"}

    if side == "client":
        def step():
            client.forward_backward(data, "ppo", config).result()
    else:
        peft_model = service.peft
        peft_model.base_model.enable_adapter_layers()  # the service keeps PEFT's layers off; the plain loop runs them
        ids = torch.tensor([d.model_input.to_ints() for d in data], device=dev)
        targets = torch.tensor([d.loss_fn_inputs["target_tokens"] for d in data], device=dev)
        mask = torch.tensor([d.loss_fn_inputs["mask"] for d in data], device=dev)
        old = torch.tensor([d.loss_fn_inputs["logprobs"] for d in data], device=dev)
        adv = torch.tensor([d.loss_fn_inputs["advantages"] for d in data], device=dev)

        def step():
            peft_model.set_adapter("bench")
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=service.autocast):
                logits = peft_model(input_ids=ids).logits
            logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).squeeze(-1)
            ratio = torch.exp(logp - old)
            loss = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            ((loss * mask).sum() / mask.sum()).backward()

    step()  # warm-up
    client.optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        base = _rss_mb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark to the current RSS
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
        client.optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(dev)  # the plain loop's backward is still queued on the GPU
    elapsed = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else _rss_mb("VmHWM") - base
    return {"tok_s": batch * length * iters / elapsed, "peak_mb": peak, "device": str(dev)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="auto", help="auto (a CUDA GPU where there is one), cpu, cuda, cuda:N")
    parser.add_argument("--batch", type=positive_int, default=8)
    parser.add_argument("--length", type=positive_int, default=384)
    parser.add_argument("--iters", type=positive_int, default=3)
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--worker", choices=["client", "plain"])
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.batch, args.length, args.iters, args.rounds = "tiny", 2, 16, 1, 1
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.batch, args.length, args.iters, args.device)))
        return
    from orchestrator.models import resolve_device

    try:
        device = str(resolve_device(args.device))
    except ValueError as exc:
        sys.exit(f"--device {args.device}: {exc}")
    results: dict[str, list[dict]] = {"client": [], "plain": []}
    for r in range(args.rounds):
        for side in ("client", "plain") if r % 2 == 0 else ("plain", "client"):
            out = subprocess.run(
                [sys.executable, __file__, "--worker", side, "--model", args.model, "--batch", str(args.batch),
                 "--length", str(args.length), "--iters", str(args.iters), "--device", device],
                stdout=subprocess.PIPE, text=True,  # stderr passes through: a failing worker says why
            )
            if out.returncode:
                sys.exit(f"the {side} worker failed (exit {out.returncode}); see its stderr above")
            results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r} {side}: {results[side][-1]}", file=sys.stderr)
    med = {side: {k: statistics.median(x[k] for x in rows) for k in ("tok_s", "peak_mb")} for side, rows in results.items()}
    print(json.dumps({
        "model": args.model, "device": device, "batch": args.batch, "length": args.length,
        "client_tok_s": round(med["client"]["tok_s"], 1), "plain_tok_s": round(med["plain"]["tok_s"], 1),
        "ratio": round(med["client"]["tok_s"] / med["plain"]["tok_s"], 3),
        "client_peak_mb": round(med["client"]["peak_mb"], 1), "plain_peak_mb": round(med["plain"]["peak_mb"], 1),
    }))


if __name__ == "__main__":
    main()
