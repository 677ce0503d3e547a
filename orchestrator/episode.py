"""One episode: ask the environment whose turn it is, get that role's validated message, step.

A reply that does not parse or validate goes back to the role with the validator's message, up
to the role's ``max_retries``; a turn still invalid after that is recorded with the role's
penalty and handed to the environment, which decides whether the episode goes on.
"""
from __future__ import annotations

import json
import math
import numbers
import random
import time
from collections.abc import Mapping

import structlog

from .envs.base import Env, StepResult
from .errors import PolicyError
from .messages import Message, parse_message
from .policies.base import Policy, PolicyOutput, PolicyRequest
from .role import RoleSpec
from .team import Team
from .transcript import Attempt, EpisodeRecord, Turn, as_json

log = structlog.get_logger()

RETRY_PROMPT = (
    "Your reply was not a valid message: {errors}. "
    "Reply again with only one JSON object that matches the schema, and nothing else."
)


def derive_seed(*parts: int) -> int:
    """A per-request sampling seed from run seed, episode, turn and attempt (stable across runs)."""
    h = 0x9E3779B1
    for p in parts:
        h = (h * 1_000_003 ^ (p & 0xFFFFFFFF)) & 0x7FFFFFFF
    return h


async def run_episode(team: Team, policies: Mapping[str, Policy], record: EpisodeRecord) -> EpisodeRecord:
    """Fill ``record`` in place (so a timeout or a policy's fault keeps the turns taken so far, and
    the tries of the turn it cut short) and return it."""
    env = team.make_env(record.task, random.Random(f"{record.seed}:{record.index}"))
    try:
        played = await _play(team, env, policies, record)
    except BaseException:
        try:
            await env.close()
        except Exception as exc:  # the play's fault (or timeout) is the one the record keeps
            log.warning("env close failed", episode=record.id, error=f"{type(exc).__name__}: {exc}")
        raise
    await env.close()
    return played


async def _play(team: Team, env: Env, policies: Mapping[str, Policy], record: EpisodeRecord) -> EpisodeRecord:
    rewards = record.rewards
    for name in team.roles:
        rewards.setdefault(name, 0.0)
    took_part = record.took_part = []
    turn = 0
    last: dict[str, Attempt] = {}  # conversation roles: each one's latest attempt
    while (role := env.next_role()) is not None:
        if turn >= team.config.max_turns:
            record.status = "max_turns"
            break
        if role not in team.roles:
            raise ValueError(f"{type(env).__name__}.next_role gave {role!r}, not a role of the team ({', '.join(team.roles)})")
        spec = team.roles[role]
        context = spec.context(record.task, env.observe(role))
        entry = await _take_turn(spec, policies[role], context, record, turn, last.get(role))
        if spec.followup_template is not None:
            last[role] = entry.attempts[-1]
        message = Message(
            id=f"{record.id}:{turn}",
            episode=record.id,
            turn=turn,
            sender=role,
            recipients=env.recipients(role),
            content=entry.content,
            raw=entry.attempts[-1].text,
            valid=entry.valid,
            errors=entry.attempts[-1].errors,
        )
        record.turns.append(entry)
        if role not in took_part:
            took_part.append(role)
        if not entry.valid:
            rewards[role] += entry.penalty
        result = await env.step(role, message)
        # None, from a turn that pays nothing, was "'NoneType' object has no attribute 'rewards'"
        if not isinstance(result, StepResult):
            raise TypeError(f"{type(env).__name__}.step returned {type(result).__name__}, not a StepResult "
                            "(StepResult() for a turn that pays nothing)")
        paid = _paid(team, env, result)
        for name, value in paid.items():
            rewards[name] += value
            if name not in took_part:
                took_part.append(name)
        entry.reward = paid.get(role, 0.0)
        entry.score = None if result.score is None else _number(env, "a score", role, result.score)
        turn += 1
        if result.done:
            break
    outcome = env.outcome()
    try:  # as the transcript holds it: unwritable there, it would fail the whole run; and kept as it
        # reads back (a tuple a list, a number key text), the run's summary and outcome_metrics see
        # what a reader of transcripts.jsonl sees
        record.outcome = json.loads(json.dumps(outcome, default=as_json))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{type(env).__name__}.outcome() holds what a transcript cannot write: {exc}") from None
    if record.status == "running":
        record.status = "ok"
    return record


def _paid(team: Team, env: Env, result: StepResult) -> dict[str, float]:
    """The step's rewards as floats. One paid to a role the team lacks (a misspelt name would
    credit no one) or that is no finite number (NaN spoils every mean, and a numpy scalar the
    transcript) is the env's fault: it ends the episode as an error, not the run."""
    for name in result.rewards:
        if name not in team.roles:
            raise ValueError(f"{type(env).__name__}.step paid a reward to {name!r}, not a role of the team "
                             f"({', '.join(team.roles)})")
    return {name: _number(env, "a reward", name, value) for name, value in result.rewards.items()}


def _number(env: Env, what: str, role: str, value: object) -> float:
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{type(env).__name__}.step gave {role!r} {what} of {value!r}: not a finite number")
    return float(value)


async def _take_turn(
    spec: RoleSpec, policy: Policy, context: dict, record: EpisodeRecord, turn: int, previous: Attempt | None = None
) -> Turn:
    """One turn of ``spec``; ``previous``: its last attempt, when the role keeps a conversation."""
    if previous is None:
        messages = spec.render(context)
    else:
        messages = previous.messages + [{"role": "assistant", "content": previous.text}, spec.render_followup(context)]
    validator = spec.validator
    attempts: list[Attempt] = []
    content = None
    try:
        for attempt in range(spec.config.max_retries + 1):
            started = time.perf_counter()
            out = await policy(
                PolicyRequest(
                    role=spec.name,
                    episode=record.id,
                    episode_index=record.index,
                    turn=turn,
                    attempt=attempt,
                    messages=messages,
                    context=context,
                    sampling=spec.config.policy.sampling,
                    adapter=record.adapters.get(spec.name, spec.config.policy.adapter),
                    seed=derive_seed(record.seed, record.index, turn, attempt),
                    reply_prefix=spec.config.reply_prefix,
                    json_schema=spec.json_schema,
                    extends=previous,
                )
            )
            if isinstance(out, str):
                out = PolicyOutput(text=out)
            elif not isinstance(out, PolicyOutput) or not isinstance(out.text, str):
                raise PolicyError(f"policy for role {spec.name!r} returned {type(out).__name__}, not text")
            content, errors = parse_message(out.text, validator)
            attempts.append(
                Attempt(
                    messages=messages,
                    text=out.text,
                    valid=not errors,
                    errors=errors,
                    prompt_ids=out.prompt_ids,
                    token_ids=out.token_ids,
                    logprobs=out.logprobs,
                    finish_reason=out.finish_reason,
                    adapter=out.adapter,
                    adapter_version=out.adapter_version,
                    duration_s=time.perf_counter() - started,
                    json_schema=out.json_schema,
                    reply_prefix=spec.config.reply_prefix if out.json_schema else "",
                    forced_tokens=out.forced_tokens,
                    spelled=out.spelled,
                    completion_tokens=out.completion_tokens,
                )
            )
            if not errors:
                break
            previous = attempts[-1]
            messages = messages + [
                {"role": "assistant", "content": out.text},
                {"role": "user", "content": RETRY_PROMPT.format(errors="; ".join(errors))},
            ]
    except BaseException:
        # the policy's fault or the episode's timeout: the tries made so far stay in the transcript,
        # without a penalty (the turn did not run out of retries)
        if attempts:
            record.turns.append(_turn(spec, record, turn, attempts, content, penalty=0.0))
        raise
    penalty = 0.0 if attempts[-1].valid else spec.config.invalid_penalty
    return _turn(spec, record, turn, attempts, content, penalty)


def _turn(spec: RoleSpec, record: EpisodeRecord, turn: int, attempts: list[Attempt], content: dict | None,
          penalty: float) -> Turn:
    valid = attempts[-1].valid
    return Turn(
        turn=turn,
        role=spec.name,
        message_id=f"{record.id}:{turn}",
        content=content if valid else None,
        valid=valid,
        retries=len(attempts) - 1,
        penalty=penalty,
        attempts=attempts,
    )
