"""Single-turn GRPO steps per second: rolecast's engine + training client versus TRL's GRPOTrainer.

Both sides run the same GRPO step on the same model and device, in the same run:

  - the same prompts (``--prompts`` per step, rendered with the model's chat template), each
    sampled ``--generations`` times at temperature 1 (64 = 8 x 8 completions per step by default);
  - exactly ``--new-tokens`` sampled tokens per completion (64 by default). TRL's generate gets
    ``generation_kwargs={"min_new_tokens": N}`` with ``max_completion_length=N`` (EOS is masked
    out until the length is reached); rolecast's requests set ``SamplingParams.ignore_eos`` and
    ``max_tokens=N`` ends every reply (a sampled EOS is kept as an ordinary token). Each side checks that every completion has N tokens;
  - the same reward on the decoded completion (special tokens skipped): the fraction of its
    characters that are digits, something a 135M model can move;
  - GRPO advantages: reward minus its group's mean, over the group's std + 1e-4 (TRL's
    ``scale_rewards="group"``); the clipped PPO loss (0.8 / 1.2, TRL's ``epsilon=0.2``) averaged
    over the batch's completion tokens (TRL's ``loss_type="dapo"``, rolecast's ``token-mean``),
    no KL term; the sampling logprobs are the old policy (one optimizer step per batch of
    generations: TRL's ``num_iterations=1`` and ``steps_per_generation`` = gradient accumulation,
    so neither side runs an extra forward pass for old logprobs);
  - LoRA r16, alpha 32, no dropout, on every linear layer (q, k, v, o, gate, up, down); AdamW at
    the same learning rate, betas (0.9, 0.999), eps 1e-8, constant schedule, grad norm clipped
    at 1.0; fp32 master weights with bf16 autocast where the device has native bf16.

rolecast's step: 64 ``engine.generate`` calls gathered (continuous batching in HFEngine, the
current adapter, per-request seeds), rewards, advantages, datums from the sampled tokens and
their sampling logprobs, one ``forward_backward(data, "ppo")`` + ``optim_step``, then
``push_to_sampler`` (the engine samples the new weights next step; ``rolecast train`` does the
same, writing the adapter to disk only at checkpoints); ``rolecast_sampling_s``,
``rolecast_update_s`` and ``rolecast_publish_s`` split each timed step into those three parts. TRL's step: one
``GRPOTrainer`` optimizer step (``model.generate`` on the PEFT model, no vLLM, then its loss
over ``--trl-micro-batch`` completions at a time). TRL turns gradient checkpointing on by
default; rolecast does not recompute activations, so it is off here unless
``--trl-gradient-checkpointing``.

Each side runs in its own subprocess (its own memory, its own threads): ``--warmup`` untimed
steps, then ``--steps`` timed ones. Sides alternate over ``--rounds`` (the machine is noisy);
a side's seconds per step is the median of its timed steps. ``episodes_s`` = completions per
step / seconds per step; ``ratio`` = rolecast episodes/s over TRL's (above 1: rolecast faster).
The last line of stdout is one JSON object; progress goes to stderr.

    python benchmarks/grpo_vs_trl.py [--model smollm2-135m] [--device auto] [--prompts 8] [--generations 8]
                                     [--new-tokens 64] [--warmup 2] [--steps 5] [--rounds 2] [--smoke]

Needs TRL (``pip install 'rolecast[bench]'``); without it the script stops with a one-line message.

``--smoke``: the tiny random model, 2 prompts x 2 generations of 4 tokens, one warm-up and one
timed step per side, one round: seconds (most of it imports), to check that the script still
runs (tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

from _recipes import TOPICS

from orchestrator.cli.flags import non_negative_int, positive_int

GROUP_EPS = 1e-4  # TRL's: (r - mean) / (std + 1e-4)
CLIP = 0.2


def prompt_texts(args: argparse.Namespace) -> list[str]:
    """The prompts of every step, in order (``--prompts`` per step); TRL's dataset holds the same list."""
    n = args.prompts * (args.warmup + args.steps)
    return [f"Give me some numbers about {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def reward(text: str) -> float:
    """The fraction of the completion's characters that are digits (0 for an empty one)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _device(spec: str):
    from orchestrator.models import resolve_device

    try:
        return resolve_device(spec)
    except ValueError as exc:
        sys.exit(f"--device {spec}: {exc}")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- rolecast ---------------------------------------------------------------------------------------
def rolecast_worker(args: argparse.Namespace) -> dict:
    import torch

    from orchestrator.engines.base import GenerationRequest, SamplingParams
    from orchestrator.engines.load import load_engine
    from orchestrator.models import bf16_native
    from orchestrator.training.client import ServiceClient
    from orchestrator.training.types import AdamParams, Datum, LoraConfig, ModelInput

    device = _device(args.device)
    torch.manual_seed(args.seed)  # LoRA A's initialisation (TRL's trainer seeds its own)
    engine = load_engine(args.model, "auto", args.seed, "hf", device=str(device))
    service = ServiceClient.for_engine(engine, args.model, seed=args.seed, device=device,
                                       bf16_autocast=bf16_native(device), micro_batch_tokens=args.micro_batch_tokens)
    service.attach_engine(engine)
    client = service.create_lora_training_client("grpo", LoraConfig(rank=16, alpha=32.0, dropout=0.0))
    adam = AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.999, eps=1e-8, grad_clip_norm=1.0)
    loss_config = {"clip_low_threshold": 1 - CLIP, "clip_high_threshold": 1 + CLIP, "aggregation": "token-mean"}
    tokenizer = engine.tokenizer
    texts = prompt_texts(args)
    N, G = args.new_tokens, args.generations

    def datum(prompt: list[int], tokens: list[int], logprobs: list[float], advantage: float) -> Datum:
        # As training/datums.py builds them: position i predicts token i + 1; prompt tokens are
        # observations (mask 0), sampled tokens actions with their sampling logprobs.
        seq = prompt + tokens
        mask = [0.0] * len(prompt) + [1.0] * len(tokens)
        lps = [0.0] * len(prompt) + logprobs
        adv = [0.0] * len(prompt) + [advantage] * len(tokens)
        return Datum(ModelInput.from_ints(seq[:-1]), {"target_tokens": seq[1:], "mask": mask[1:],
                                                      "logprobs": lps[1:], "advantages": adv[1:]})

    async def run() -> dict:
        with tempfile.TemporaryDirectory() as sampler:
            await (await client.save_weights_for_sampler_async(sampler)).result_async()  # the engine has the adapter
            times, rewards, phases = [], [], {"sampling": [], "update": [], "publish": []}
            for step in range(args.warmup + args.steps):
                t0 = time.perf_counter()
                prompts = [engine.apply_chat_template([{"role": "user", "content": t}])
                           for t in texts[step * args.prompts:(step + 1) * args.prompts]]
                requests = [GenerationRequest(tuple(p), SamplingParams(temperature=1.0, top_p=1.0, max_tokens=N, ignore_eos=True,
                                                                       seed=args.seed * 1_000_003 + step * 10_007 + i),
                                              adapter="grpo")
                            for i, p in enumerate(p for p in prompts for _ in range(G))]
                outs = await asyncio.gather(*(engine.generate(r) for r in requests))
                phases["sampling"].append(time.perf_counter() - t0)
                if any(len(o.token_ids) != N for o in outs):
                    sys.exit(f"rolecast sampled {sorted({len(o.token_ids) for o in outs})} tokens, not {N}")
                r = [reward(tokenizer.decode(o.token_ids, skip_special_tokens=True)) for o in outs]
                data = []
                for g in range(len(prompts)):
                    group = r[g * G:(g + 1) * G]
                    mean, std = statistics.fmean(group), statistics.stdev(group)
                    for k in range(g * G, (g + 1) * G):
                        adv = (r[k] - mean) / (std + GROUP_EPS)
                        data.append(datum(list(requests[k].prompt_ids), outs[k].token_ids, outs[k].logprobs, adv))
                await (await client.forward_backward_async(data, "ppo", loss_config)).result_async()
                await (await client.optim_step_async(adam)).result_async()
                _sync(device)
                t2 = time.perf_counter()
                await (await client.push_to_sampler_async()).result_async()
                _sync(device)
                times.append(time.perf_counter() - t0)
                phases["update"].append(t2 - t0 - phases["sampling"][-1])  # rewards and datums too
                phases["publish"].append(times[-1] - (t2 - t0))
                rewards.append(statistics.fmean(r))
                log(f"rolecast step {step}: {times[-1]:.2f}s, mean reward {rewards[-1]:.4f}")
        await engine.aclose()
        service.close()
        return {"times": times[args.warmup:], **{k: v[args.warmup:] for k, v in phases.items()}, "rewards": rewards,
                "device": str(device),
                "bf16": service.autocast, "engine_dtype": str(engine.loaded.dtype).removeprefix("torch.")}

    return asyncio.run(run())


# -- TRL --------------------------------------------------------------------------------------------
def trl_worker(args: argparse.Namespace) -> dict:
    import trl
    from datasets import Dataset
    from peft import LoraConfig as PeftLoraConfig
    from transformers import TrainerCallback

    from orchestrator.models import bf16_native, load_model
    from orchestrator.training.types import LoraConfig

    # transformers 5 renamed gradient_checkpointing (TRL's config still sets it): not this script's business
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
    device = _device(args.device)
    loaded = load_model(args.model, dtype="float32", seed=args.seed)  # fp32 master weights, as the client's
    tokenizer = loaded.tokenizer
    tokenizer.padding_side = "left"
    N = args.new_tokens
    rewards: list[float] = []

    def digit_fraction(completions, completion_ids, **_) -> list[float]:
        if any(len(ids) != N for ids in completion_ids):
            raise RuntimeError(f"TRL sampled {sorted({len(ids) for ids in completion_ids})} tokens, not {N}")
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        out = [reward(t) for t in texts]
        rewards.append(statistics.fmean(out))
        return out

    clock: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            _sync(device)
            clock.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            _sync(device)
            clock.append(time.perf_counter())
            log(f"trl step {len(clock) - 2}: {clock[-1] - clock[-2]:.2f}s, mean reward {rewards[-1]:.4f}")

    completions = args.prompts * args.generations
    micro = args.trl_micro_batch or completions
    if completions % micro:
        sys.exit(f"--trl-micro-batch {micro} must divide the {completions} completions per step")
    bf16 = bf16_native(device)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t}]} for t in prompt_texts(args)])
    with tempfile.TemporaryDirectory() as out_dir:
        config = trl.GRPOConfig(
            output_dir=out_dir, report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no",
            disable_tqdm=True, seed=args.seed, use_cpu=device.type == "cpu", bf16=bf16, fp16=False,
            max_steps=args.warmup + args.steps, per_device_train_batch_size=micro,
            gradient_accumulation_steps=completions // micro,  # one optimizer step per generation batch
            num_generations=args.generations, max_completion_length=N, generation_kwargs={"min_new_tokens": N},
            temperature=1.0, top_p=1.0, top_k=0, use_vllm=False, num_iterations=1, beta=0.0, epsilon=CLIP,
            loss_type="dapo", scale_rewards="group", learning_rate=args.lr, lr_scheduler_type="constant",
            warmup_steps=0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
            gradient_checkpointing=args.trl_gradient_checkpointing, log_completions=False,
        )
        target = list(LoraConfig().target_modules)
        trainer = trl.GRPOTrainer(
            model=loaded.model, reward_funcs=digit_fraction, args=config, train_dataset=dataset,
            processing_class=tokenizer, callbacks=[Clock()],
            peft_config=PeftLoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=target,
                                       task_type="CAUSAL_LM"),
        )
        trainer.train()
    times = [b - a for a, b in zip(clock, clock[1:])]
    if len(times) != args.warmup + args.steps:
        sys.exit(f"TRL ran {len(times)} steps, not {args.warmup + args.steps}")
    return {"times": times[args.warmup:], "rewards": rewards, "device": str(trainer.args.device), "bf16": bf16,
            "trl_version": trl.__version__, "torch_dtype": str(loaded.dtype).removeprefix("torch.")}


WORKERS = {"rolecast": rolecast_worker, "trl": trl_worker}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="auto", help="auto (a CUDA GPU where there is one), cpu, cuda, cuda:N")
    parser.add_argument("--prompts", type=positive_int, default=8, help="distinct prompts per step")
    parser.add_argument("--generations", type=positive_int, default=8, help="completions per prompt (the GRPO group)")
    parser.add_argument("--new-tokens", type=positive_int, default=64, help="sampled tokens per completion, on both sides")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="untimed steps per side and round")
    parser.add_argument("--steps", type=positive_int, default=5, help="timed steps per side and round")
    parser.add_argument("--rounds", type=positive_int, default=2, help="each side runs once per round, order alternating")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--micro-batch-tokens", type=positive_int, default=None,
                        help="rolecast's training client: cost budget per forward/backward pass (default: the device's)")
    parser.add_argument("--trl-micro-batch", type=non_negative_int, default=0,
                        help="TRL's per-device batch (gradient accumulation makes up the rest); 0 = all completions")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true", help="TRL's default; off here")
    parser.add_argument("--worker", choices=sorted(WORKERS))
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.prompts, args.generations, args.new_tokens = "tiny", 2, 2, 4
        args.warmup, args.steps, args.rounds = 1, 1, 1
    if args.generations < 2:
        sys.exit("--generations must be at least 2 (GRPO's group baseline)")
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return
    if importlib.util.find_spec("trl") is None:
        sys.exit("benchmarks/grpo_vs_trl.py needs TRL, which is not installed: pip install 'rolecast[bench]'")
    device = _device(args.device)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    results: dict[str, list[dict]] = {"rolecast": [], "trl": []}
    for r in range(args.rounds):
        for side in ("rolecast", "trl") if r % 2 == 0 else ("trl", "rolecast"):
            log(f"round {r}: {side}")
            proc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--worker", side], stdout=subprocess.PIPE,
                                  text=True, env=env)  # stderr passes through: progress as it happens
            if proc.returncode != 0:
                sys.exit(f"the {side} worker failed (exit {proc.returncode}); see its stderr above")
            results[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    s_per_step = {side: statistics.median(t for row in rows for t in row["times"]) for side, rows in results.items()}
    completions = args.prompts * args.generations
    eps = {side: completions / s for side, s in s_per_step.items()}
    first = {side: rows[0] for side, rows in results.items()}
    print(json.dumps({
        "model": args.model, "device": str(device), "completions": completions, "prompts": args.prompts,
        "generations": args.generations, "new_tokens": args.new_tokens, "steps": args.steps, "warmup": args.warmup,
        "rounds": args.rounds,
        "rolecast_s_per_step": round(s_per_step["rolecast"], 4), "trl_s_per_step": round(s_per_step["trl"], 4),
        "rolecast_episodes_s": round(eps["rolecast"], 3), "trl_episodes_s": round(eps["trl"], 3),
        "ratio": round(eps["rolecast"] / eps["trl"], 3),
        "rolecast_step_s": [round(t, 3) for row in results["rolecast"] for t in row["times"]],
        # each timed step's parts: sampling the completions (the engine); rewards, datums,
        # forward_backward and optim_step; save_weights_for_sampler (the engine takes the new weights)
        **{f"rolecast_{k}_s": [round(t, 3) for row in results["rolecast"] for t in row[k]]
           for k in ("sampling", "update", "publish")},
        "trl_step_s": [round(t, 3) for row in results["trl"] for t in row["times"]],
        # mean reward per step of the first round (warm-up steps included): both should move alike
        "rolecast_rewards": [round(x, 4) for x in first["rolecast"]["rewards"]],
        "trl_rewards": [round(x, 4) for x in first["trl"]["rewards"]],
        "bf16": first["rolecast"]["bf16"], "trl_bf16": first["trl"]["bf16"],
        "engine_dtype": first["rolecast"]["engine_dtype"], "trl_version": first["trl"]["trl_version"],
        "lr": args.lr, "micro_batch_tokens": args.micro_batch_tokens,
        "trl_micro_batch": args.trl_micro_batch or completions,
        "trl_gradient_checkpointing": args.trl_gradient_checkpointing,
    }))


if __name__ == "__main__":
    main()
