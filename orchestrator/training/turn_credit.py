"""Turn-level credit: what each of a role's moves earned on its own, beside the episode's advantage.

An episode's advantage credits every move of a role alike, so in a game of several turns the
one move that decided it is hidden among the others, and a move whose worth shows only across
many episodes (an opening that halves the range) drowns in the outcome's noise. Environments
that can judge a move score it (``StepResult.score``, kept as ``Turn.score``); with
``training.turn_credit: w`` the tokens of a role's k-th turn in an episode also get

    w * (score - mean score of that role's k-th turns in the episode's group)

The baseline is per position because a role's k-th turns in one group start from comparable
states (the first guesses of Guess the Number all face 1..16), while later turns are easier to
score well on. An unscored turn (None) gets nothing and stays out of the baseline. MT-GRPO
(Zeng et al., 2025, arXiv 2505.11821) also adds group-relative turn-level rewards to GRPO's
outcome advantage, over a tree of rollouts that branches at each turn; this takes the episodes
as they were played, so it costs no extra sampling.
"""
from __future__ import annotations

from collections import defaultdict

from ..transcript import EpisodeRecord
from .trainer import centred

TurnAdvantages = dict[str, dict[int, float]]  # role -> {turn number in the episode: extra advantage}


def turn_advantages(groups: list[list[EpisodeRecord]], roles: list[str], weight: float) -> list[list[TurnAdvantages]]:
    """Per group and episode, each role's extra advantage for its scored turns."""
    out: list[list[TurnAdvantages]] = []
    for group in groups:
        extras: list[TurnAdvantages] = [{role: {} for role in roles} for _ in group]
        for role in roles:
            by_position: dict[int, list[tuple[int, int, float]]] = defaultdict(list)  # (episode, turn, score)
            for e, episode in enumerate(group):
                for position, turn in enumerate(t for t in episode.turns if t.role == role):
                    if turn.score is not None:
                        by_position[position].append((e, turn.turn, turn.score))
            for scored in by_position.values():
                for (e, n, _), value in zip(scored, centred([s for *_, s in scored], scale_std=False)):
                    extras[e][role][n] = weight * value
        out.append(extras)
    return out
