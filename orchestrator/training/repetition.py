"""A role's reward lowered for saying what others in the same step said: R-Zero's repetition
penalty (Huang et al., 2025) for a Challenger/Proposer that would otherwise collapse onto one
question, with exact equality of the role's messages in place of its BLEU clusters.

For a role with penalty lambda, an episode whose messages from that role (the canonical JSON of
each valid turn's content, in order) equal those of k of the step's other N - 1 episodes loses

    lambda * k / (N - 1)

so a message no one else sent keeps its reward, and one that all N sent loses lambda. Episodes
where the role sent no valid message are neither penalised nor counted as repeats (an invalid
turn has its own penalty), and episodes that failed are not among the N.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..transcript import EpisodeRecord


def said(episode: EpisodeRecord, role: str) -> str | None:
    """What ``role`` said in ``episode``, as one comparable key; None if it said nothing valid, or
    the episode failed."""
    if episode.failed:
        return None
    contents = [t.content for t in episode.turns if t.role == role and t.valid]
    return json.dumps(contents, sort_keys=True) if contents else None


def repetition_shares(episodes: list[EpisodeRecord], role: str) -> list[float | None]:
    """Per episode, the share of the other episodes in which ``role`` said the same (None where it
    said nothing valid)."""
    keys = [said(ep, role) for ep in episodes]
    counts = Counter(k for k in keys if k is not None)
    others = max(sum(not ep.failed for ep in episodes) - 1, 1)
    return [None if k is None else (counts[k] - 1) / others for k in keys]


def penalise_repetition(groups: list[list[EpisodeRecord]], rewards: list[list[dict[str, float]]],
                        penalties: Mapping[str, float]) -> tuple[list[list[dict[str, float]]], dict[str, Any]]:
    """``rewards`` (per group, per episode, per role) less each penalised role's repetition penalty
    over the whole step; and per penalised role its mean repetition share (``ROLE/repeated``)."""
    episodes = [ep for g in groups for ep in g]
    out = [[dict(rw) for rw in g] for g in rewards]
    flat = [rw for g in out for rw in g]
    metrics: dict[str, Any] = {}
    for role, weight in penalties.items():
        shares = repetition_shares(episodes, role)
        for rw, share in zip(flat, shares):
            if share:
                rw[role] = rw.get(role, 0.0) - weight * share
        seen = [s for s in shares if s is not None]
        if seen:
            metrics[f"{role}/repeated"] = round(sum(seen) / len(seen), 4)
    return out, metrics
