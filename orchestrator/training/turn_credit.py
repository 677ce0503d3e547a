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

History credit (``training.history_credit: w``) needs no scores. Turns of a role that saw the
same prompt tokens, in any of the step's groups, faced the same decision as far as the policy
can tell; each gets

    w * (the role's episode reward - the mean reward of the turns that saw the same prompt)

Two such turns share every earlier move and reply, so their rewards differ only by what this
turn and later ones did, and by what the prompt hides (Guess the Number's secret, which differs
between groups). Comparing them across groups therefore judges a move by what it earns against
every task that looks alike, not against one task's group, whose outcome also carries the luck
of the earlier turns. GiGPO (Feng et al., 2025, arXiv 2505.10978) groups repeated states within
a task's group in the same way. A prompt seen once gets nothing.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from ..transcript import EpisodeRecord
from .trainer import centred

TurnAdvantages = dict[str, dict[int, float]]  # role -> {turn number in the episode: extra advantage}


def turn_advantages(groups: list[list[EpisodeRecord]], roles: list[str], weight: float) -> list[list[TurnAdvantages]]:
    """Per group and episode, each role's extra advantage for its scored turns (none in an episode
    that failed)."""
    out: list[list[TurnAdvantages]] = []
    for group in groups:
        extras: list[TurnAdvantages] = [{role: {} for role in roles} for _ in group]
        for role in roles:
            by_position: dict[int, list[tuple[int, int, float]]] = defaultdict(list)  # (episode, turn, score)
            for e, episode in enumerate(group):
                if episode.failed:  # its turns' scores are compared with no one's
                    continue
                for position, turn in enumerate(t for t in episode.turns if t.role == role):
                    if turn.score is not None:
                        by_position[position].append((e, turn.turn, turn.score))
            for scored in by_position.values():
                for (e, n, _), value in zip(scored, centred([s for *_, s in scored], scale_std=False)):
                    extras[e][role][n] = weight * value
        out.append(extras)
    return out


def history_advantages(groups: list[list[EpisodeRecord]], rewards: list[list[dict[str, float]]], roles: list[str],
                       weight: float) -> list[list[TurnAdvantages]]:
    """Per group and episode, each role's extra advantage for its turns whose prompt another turn
    of the step saw too. A turn's key is its role, the adapter that played it (a self-play
    opponent's turns are not the learner's) and its first attempt's prompt tokens; episodes that
    ended in a fault and turns without sampled prompts are left out."""
    out: list[list[TurnAdvantages]] = [[{role: {} for role in roles} for _ in group] for group in groups]
    alike: dict[tuple, list[tuple[int, int, int, float]]] = defaultdict(list)  # key -> (group, episode, turn, reward)
    for g, group in enumerate(groups):
        for e, episode in enumerate(group):
            if episode.failed:
                continue
            for turn in episode.turns:
                if turn.role in roles and turn.attempts and turn.attempts[0].prompt_ids:
                    key = (turn.role, episode.adapters.get(turn.role), tuple(turn.attempts[0].prompt_ids))
                    alike[key].append((g, e, turn.turn, rewards[g][e][turn.role]))
    for (role, *_), seen in alike.items():
        if len(seen) > 1:
            for (g, e, n, _), value in zip(seen, centred([r for *_, r in seen], scale_std=False)):
                out[g][e][role][n] = weight * value
    return out


def combined(*parts: list[list[TurnAdvantages]] | None) -> list[list[TurnAdvantages]] | None:
    """The sum, turn by turn, of the kinds of turn credit a run uses (None: none)."""
    used = [p for p in parts if p is not None]
    if len(used) < 2:
        return used[0] if used else None
    return [[_summed(alike) for alike in zip(*groups)] for groups in zip(*used)]


def _summed(extras: tuple[TurnAdvantages, ...]) -> TurnAdvantages:
    total: dict[str, Counter] = defaultdict(Counter)
    for extra in extras:
        for role, turns in extra.items():
            total[role].update(turns)  # update adds, keeping negative values (Counter's + would drop them)
    return {role: dict(turns) for role, turns in total.items()}
