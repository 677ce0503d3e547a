"""Schema-constrained decoding versus free decoding, on the default model, every library role.

For each built-in role (roles/*.yaml, all of which declare an output schema), --samples prompts
rendered from the role's own template go through the engine in three modes:

- free: the model writes what it likes after the role's reply_prefix, with the role's budget;
- constrained: the engine masks what the schema does not allow;
- free-matched: free again, but each request's max_tokens is the length of its constrained
  reply, so both sides generate (nearly) the same number of tokens from the same prompts.

Validity is that of free versus constrained: each reply gets one attempt, no retries, and is
checked exactly as an episode checks it (tolerant extraction, then the schema).

Throughput is constrained versus free-matched, generated tokens per second of wall time (prefill
included, identical prompts on both sides). Free against constrained at the roles' own budgets
(`end_to_end_ratio`) mostly measures reply length instead: constrained replies stop as soon as
the message is complete, about half as long, so prompt prefill weighs twice as much per
generated token. Modes alternate in rounds, so load from elsewhere on the machine hits all
alike. Grammars are compiled before the clock starts (`compile_s`); `grammar_s` is the time the
engine spent on masks and length budgets.

    python benchmarks/constrained.py [--model smollm2-135m] [--samples 32] [--rounds 2] [--max-tokens N] [--smoke]

``--smoke``: the tiny random model, 2 replies per role, replies capped at 8 tokens: seconds, to
check that the script still runs (tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

from orchestrator.cli.flags import positive_int
from orchestrator.engines.base import GenerationRequest, SamplingParams
from orchestrator.engines.hf import HFEngine
from orchestrator.envs.guess_number import GuessNumberConfig, GuessNumberEnv
from orchestrator.messages import Message, parse_message, schema_json
from orchestrator.models import load_model
from orchestrator.role import LIBRARY_DIR, RoleSpec, library_roles, load_role
from orchestrator.team import load_team

TASKS = [
    "cart.total() skips the last item of the cart.",
    "stats.mean() raises ZeroDivisionError on an empty list; it should return 0.0.",
    "slugify() drops accented letters instead of transliterating them.",
    "parse_duration('1h30m') returns 30 minutes instead of 90.",
]
HISTORY = [
    {"role": "planner", "content": {"summary": "the loop stops one item early", "steps": ["fix the range in total()"]}},
    {"role": "coder", "content": {"edits": [{"path": "cart.py", "search": "range(len(items) - 1)", "replace": "range(len(items))"}]}},
]
TOPICS = ["Homework should be banned in primary schools.", "Zoos should be closed.",
          "Remote work is better than office work.", "Space exploration is worth its cost."]
ARGUMENTS = [{"stance": "for", "argument": "Children need time to play and rest after school."},
             {"stance": "against", "argument": "Practice at home builds habits that last."}]


def number_guesser_observation(i: int) -> dict:
    """Guess the Number's own observation, ``i % 2`` guesses in: the template reads what the env's
    ``observe()`` provides, which a copy here would not follow when it changes (one did)."""
    role = "number_guesser"
    config = GuessNumberConfig(players=[role], low=1, high=100, turns=7)
    env = GuessNumberEnv(config, {}, {"secret": 37}, random.Random(i))
    for turn in range(i % 2):
        asyncio.run(env.step(role, Message(id=f"bench:{turn}", episode="bench", turn=turn, sender=role, recipients=[],
                                           content={"guess": 50}, raw='{"guess": 50}', valid=True)))
    return env.observe(role)


RECIPES = Path(__file__).resolve().parent.parent / "recipes"
# library role -> (recipe, the role's name there) for roles whose observation an environment builds
# as the episode goes; the turns before theirs get these replies, by the acting role's name.
PLAYED_IN = {"judge": ("debate.yaml", "judge"), "teacher": ("teacher_student.yaml", "teacher_largest"),
             "student": ("teacher_student.yaml", "student"), "verifier": ("generate_judge.yaml", "judge")}
REPLIES = {"pro": {"argument": ARGUMENTS[0]["argument"]}, "con": {"argument": ARGUMENTS[1]["argument"]},
           "teacher_largest": {"example": "Which is the largest: 3, 9, 4? Answer: 9."}, "generator": {"answer": 12}}


def env_observation(role: str, i: int) -> tuple[dict, dict]:
    """The (task, observation) the environment gives ``role`` in episode ``i`` of its recipe, after
    the scripted turns before it: built by the env itself, so it follows the env's changes."""
    recipe, name = PLAYED_IN[role]
    team = load_team(RECIPES / recipe)
    task = team.tasks[i % len(team.tasks)] if recipe != "teacher_student.yaml" else {"domain": "largest"}
    env = team.make_env(task, random.Random(i))
    turn = 0
    while (who := env.next_role()) != name:
        content = REPLIES[who]
        asyncio.run(env.step(who, Message(id=f"bench:{turn}", episode="bench", turn=turn, sender=who, recipients=[],
                                          content=content, raw=json.dumps(content), valid=True)))
        turn += 1
    return task, env.observe(name)


SPECS = ["Return x plus 3.", "Return the string x reversed.", "Return the largest number in the list x."]


def observation(role: str, i: int) -> tuple[dict, dict]:
    """A (task, observation) the role's template renders, varied by ``i``."""
    task = {"text": TASKS[i % len(TASKS)]}
    if role == "number_guesser":
        return task, number_guesser_observation(i)
    if role in PLAYED_IN:
        return env_observation(role, i)
    by_role = {
        "answerer": {"secret": ["dog", "piano", "apple", "bicycle"][i % 4],
                     "question": ["Is it alive?", "Can you eat it?", "Is it bigger than a chair?", "Does it make sound?"][i // 4 % 4]},
        "coder": {"history": HISTORY[:1]},
        "example_tester": {"spec": SPECS[i % len(SPECS)]},
        "function_coder": {"spec": SPECS[i % len(SPECS)], "example": "f(2) == 5" if i % 2 else None},
        "proposer": {"max_operand": 999},
        "solver": {"problem": {"a": 12 + i, "op": "+*-"[i % 3], "b": 7}},
        "debater": {"topic": TOPICS[i % 4], "round": 1 + i % 2, "rounds": 2, "arguments": ARGUMENTS[: i % 3]},
        "game_player": {"observation": "Tic-Tac-Toe, you are X.\n X | . | O\n . | O | .\n . | . | X",
                        "legal_moves": ["b1", "a2", "c2", "a3", "b3"]},
        "guesser": {"history": [{"question": "Is it alive?", "answer": "no"}][: i % 2], "questions_left": 20 - i % 5},
        "planner": {"history": []},
        "reviewer": {"history": HISTORY},
        "tester": {"history": HISTORY},
    }
    return task, by_role.get(role, {})


def requests(engine: HFEngine, spec: RoleSpec, n: int, constrained: bool, cap: int | None) -> list[GenerationRequest]:
    s, prefix, out = spec.config.policy.sampling, spec.config.reply_prefix, []
    for i in range(n):
        task, obs = observation(spec.name, i)
        prompt = engine.apply_chat_template(spec.render(spec.context(task, obs))) + engine.encode(prefix)
        max_tokens = s.max_tokens if cap is None else min(s.max_tokens, cap)
        out.append(GenerationRequest(
            tuple(prompt), SamplingParams(s.temperature, s.top_p, max_tokens, tuple(s.stop), seed=1000 + i),
            json_schema=schema_json(spec.schema) if constrained else None, reply_prefix=prefix if constrained else "",
        ))
    return out


async def run_batch(engine, batch):
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(r) for _, r in batch))
    return outs, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--samples", type=positive_int, default=32, help="replies per role and mode")
    parser.add_argument("--rounds", type=positive_int, default=2, help="free/constrained alternations (samples split across them)")
    parser.add_argument("--roles", nargs="*", default=None, help="library roles (default: all)")
    parser.add_argument("--max-tokens", type=positive_int, default=None, help="cap on every role's budget (default: none)")
    parser.add_argument("--smoke", action="store_true", help="seconds on the tiny model: does the script still run")
    args = parser.parse_args()
    if args.smoke:  # a random-weight model seldom stops by itself, hence the cap
        args.model, args.samples, args.rounds, args.max_tokens = "tiny", 2, 1, 8

    loaded = load_model(args.model, dtype=args.dtype)
    engine = HFEngine(loaded)
    specs = [load_role(LIBRARY_DIR / f"{name}.yaml") for name in (args.roles or library_roles())]
    t0 = time.perf_counter()
    for spec in specs:
        engine._grammars.compiled(schema_json(spec.schema))
    compile_s = time.perf_counter() - t0

    modes = ("free", "constrained", "free_matched")
    work = {m: [(spec, r) for spec in specs for r in requests(engine, spec, args.samples, m == "constrained", args.max_tokens)]
            for m in modes[:2]}
    stats = {m: {"tokens": 0, "seconds": 0.0, "grammar_s": 0.0, "results": []} for m in modes}

    async def measure():
        await run_batch(engine, work["constrained"][:4])  # warm-up
        for r in range(args.rounds):
            for mode in modes:
                if mode == "free_matched":  # the constrained replies' lengths as budgets
                    done = stats["constrained"]["results"][-len(work["constrained"][r :: args.rounds]):]
                    batch = [(spec, replace(req, sampling=replace(req.sampling, max_tokens=len(out.token_ids))))
                             for (spec, out), (_, req) in zip(done, work["free"][r :: args.rounds])]
                else:
                    batch = work[mode][r :: args.rounds]
                grammar_before = engine.stats.grammar_s
                outs, seconds = await run_batch(engine, batch)
                tokens = sum(len(o.token_ids) for o in outs)
                stats[mode]["tokens"] += tokens
                stats[mode]["seconds"] += seconds
                stats[mode]["grammar_s"] += engine.stats.grammar_s - grammar_before
                stats[mode]["results"] += [(spec, o) for (spec, _), o in zip(batch, outs)]
                print(f"round {r} {mode}: {len(batch)} replies, {tokens} tokens in {seconds:.1f}s", file=sys.stderr)
        await engine.aclose()

    asyncio.run(measure())
    per_role: dict[str, dict] = {spec.name: {} for spec in specs}
    for mode, st in stats.items():
        st["tok_s"] = st["tokens"] / st["seconds"]
        if mode == "free_matched":
            continue
        st["valid"] = 0
        for spec in specs:
            mine = [o for s, o in st["results"] if s is spec]
            valid = sum(not parse_message(spec.config.reply_prefix + o.text, spec.validator)[1] for o in mine)
            st["valid"] += valid
            per_role[spec.name][f"valid_{mode}"] = round(valid / len(mine), 3)
            if mode == "constrained":
                per_role[spec.name]["closed_by_force"] = sum(o.forced_tokens > 0 for o in mine)
                per_role[spec.name]["truncated"] = sum(o.finish_reason == "length" and not o.forced_tokens for o in mine)
        st["valid"] /= len(st["results"])
    for name, row in per_role.items():
        print(f"{name:15s} {json.dumps(row)}", file=sys.stderr)
    print(json.dumps({
        "model": args.model, "dtype": str(loaded.dtype).removeprefix("torch."), "roles": len(specs),
        "samples_per_role": args.samples, "max_tokens": args.max_tokens, "per_role": per_role,
        "valid_free": round(stats["free"]["valid"], 3), "valid_constrained": round(stats["constrained"]["valid"], 3),
        "free_tok_s": round(stats["free"]["tok_s"], 1), "constrained_tok_s": round(stats["constrained"]["tok_s"], 1),
        "free_matched_tok_s": round(stats["free_matched"]["tok_s"], 1),
        "tokens": {m: stats[m]["tokens"] for m in modes},
        "throughput_ratio": round(stats["constrained"]["tok_s"] / stats["free_matched"]["tok_s"], 3),
        "end_to_end_ratio": round(stats["constrained"]["tok_s"] / stats["free"]["tok_s"], 3),
        "grammar_s": round(stats["constrained"]["grammar_s"], 2), "constrained_s": round(stats["constrained"]["seconds"], 1),
        "compile_s": round(compile_s, 2),
    }))


if __name__ == "__main__":
    main()
