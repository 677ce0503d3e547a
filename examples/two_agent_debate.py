"""Two debaters, each with its own LoRA adapter, learn from a judge's verdicts (Tinker-style API).

Each step: play a few debates through the engine, reward the judge's winner +1 and the loser
-0.5 (the debate protocol's rewards), centre the rewards per debater, and update both adapters
with the PPO loss through the async API; then both adapters are saved.

    python examples/two_agent_debate.py [--model tiny] [--steps 2] [--debates 4] [--out runs/two_agent_debate]
"""
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from orchestrator.engines.hf import HFEngine
from orchestrator.models import load_model
from orchestrator.rollout import RunOptions, build_policies, run_team
from orchestrator.team import load_team
from orchestrator.training.client import ServiceClient
from orchestrator.training.datums import role_datums
from orchestrator.training.types import AdamParams, LoraConfig

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "debate.yaml"
PPO = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "aggregation": "token-mean", "temperature": 0.8}


async def main(model: str, steps: int, debates: int, out: Path) -> None:
    team = load_team(RECIPE)  # debaters "pro" and "con" sample adapters "pro" and "con"; the judge is the base model
    engine = HFEngine(load_model(model))
    service = ServiceClient(model)
    service.attach_engine(engine)
    clients = {name: service.create_lora_training_client(name, LoraConfig(rank=8)) for name in ("pro", "con")}
    policies = build_policies(team, {}, lambda: engine)
    for name, client in clients.items():  # the engine now samples both adapters (version 1)
        await (await client.save_weights_for_sampler_async(out / "sampler" / name)).result_async()

    for step in range(1, steps + 1):
        result = await run_team(team, policies, RunOptions(episodes=debates, seed=step, out_dir=out / f"step-{step}", progress=False))
        futures = {}
        for name, client in clients.items():
            rewards = [ep.rewards[name] for ep in result.episodes]
            mean = sum(rewards) / len(rewards)
            data = [d for ep, r in zip(result.episodes, rewards) for d in role_datums(ep, name, r - mean)]
            if data:  # both adapters' forward_backward calls are in flight at once
                futures[name] = await client.forward_backward_async(data, "ppo", PPO)
        for name, future in futures.items():
            out_fb = await future.result_async()
            await (await clients[name].optim_step_async(AdamParams(learning_rate=5e-5))).result_async()
            version = await (await clients[name].save_weights_for_sampler_async(out / "sampler" / name)).result_async()
            print(f"step {step} {name}: mean reward {sum(ep.rewards[name] for ep in result.episodes) / debates:+.2f}, "
                  f"loss {out_fb.metrics['loss']:.4f}, adapter version {version}")

    for name, client in clients.items():
        path = await (await client.save_state_async(out / "final" / name)).result_async()
        print(f"saved {name}: {path}")
    await engine.aclose()
    service.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--debates", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("runs/two_agent_debate"))
    args = parser.parse_args()
    asyncio.run(main(args.model, args.steps, args.debates, args.out))
