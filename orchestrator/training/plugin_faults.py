"""A reward or trainer plugin failing inside a training step: one line naming the plugin and its
hook, exit 1 (RunFailed), before any weight moves; not a traceback, and not a NaN reward that
would reach every adapter it trains and corrupt it."""
from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from ..errors import RolecastError, RunFailed, one_line

FIX = "fix it, then --resume from the last checkpoint"


@contextlib.contextmanager
def said_as(error: Callable[[str], Exception], what: str) -> Iterator[None]:
    """An exception inside the block (plugin code) is ``error`` of one line: "WHAT raised TYPE: TEXT"."""
    try:
        yield
    except RolecastError:
        raise
    except Exception as exc:
        raise error(f"{what} raised {one_line(exc)}") from exc


def blamed(kind: str, name: str, hook: str) -> contextlib.AbstractContextManager[None]:
    """An exception inside the block is the plugin's: said as such, in a training step."""
    return said_as(lambda said: RunFailed(f"{said}; {FIX}"), f"{kind} plugin {name!r}: {hook}")


def checked(values: list[list[Any]], roles: Iterable[str] | None, kind: str, name: str, hook: str,
            like: list[list[Any]] | None = None) -> list[list[Any]]:
    """``values`` (per group, per episode, a mapping of role to number) with a finite number for
    each of ``roles`` (None: for whatever roles a mapping holds), and as many groups and episodes
    as ``like`` where given (else the step indexed past their end: an IndexError traceback); the
    same values with those numbers as floats."""
    if like is not None and (shape := [len(g) for g in values]) != (wanted := [len(g) for g in like]):
        raise RunFailed(f"{kind} plugin {name!r}: {hook} gave {shape} episodes per group for the step's {wanted}; {FIX}")
    out = []
    for g, group in enumerate(values):
        out.append([])
        for e, row in enumerate(group):
            if not isinstance(row, Mapping):
                raise RunFailed(f"{kind} plugin {name!r}: {hook} gave {row!r} for episode {e} of group {g}, not a "
                                f"mapping of role to number; {FIX}")
            row = dict(row)
            for role in list(row) if roles is None else roles:
                value = row.get(role)
                # a numpy scalar (np.mean of float32s) is a number, as an env's reward may be; as a float it
                # goes into credit.jsonl, whose JSON a numpy float32 fails
                if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)):
                    raise RunFailed(f"{kind} plugin {name!r}: {hook} gave role {role!r} {value!r} in episode {e} of "
                                    f"group {g}, where a finite number is needed; {FIX}")
                row[role] = float(value)
            out[-1].append(row)
    return out


def measured(metrics: Mapping[str, Any], kind: str, name: str, hook: str, taken: Collection[str] = ()) -> dict[str, float]:
    """A hook's extra metrics for the step's row as floats: a number of any kind (Python, numpy, a
    0-d tensor) is one; anything else would fail the row's JSON (a tensor) after the weights moved.
    A key in ``taken`` (the row's own: loss, step) would overwrite the loop's figure."""
    if not isinstance(metrics, Mapping):  # an override that returns nothing: was a TypeError traceback, its row lost
        raise RunFailed(f"{kind} plugin {name!r}: {hook} gave {metrics!r}, not a mapping of metric name to number "
                        f"(return {{}} for none); {FIX}")
    if clash := sorted(set(metrics) & set(taken), key=str):
        raise RunFailed(f"{kind} plugin {name!r}: {hook} gave {clash[0]!r}, a key the step's row has already "
                        f"(the loop's own metric); name it otherwise, e.g. '{name}/{clash[0]}'; {FIX}")
    out = {}
    for key, value in metrics.items():
        if not (isinstance(key, str) and (isinstance(value, numbers.Real) or
                                          getattr(value, "shape", None) == () and isinstance(value.item(), numbers.Real))):
            raise RunFailed(f"{kind} plugin {name!r}: {hook} gave {key!r} a {type(value).__name__}, where a number "
                            f"is needed; {FIX}")
        out[key] = float(value)
    return out


def learning(adapters: Iterable[Any], learners: Collection[str], name: str) -> list[str]:
    """``adapters_to_train``'s answer, each one of the trainer's ``learners``: another has no
    training client (a KeyError traceback where the step's datums are built)."""
    if isinstance(adapters, str):  # one name, not a list of them: read letter by letter, 'p' was the stranger named
        raise RunFailed(f"trainer plugin {name!r}: adapters_to_train gave {adapters!r}, a string where a list of "
                        f"adapters goes; {FIX}")
    adapters = list(adapters)
    if strangers := [a for a in adapters if a not in learners]:
        raise RunFailed(f"trainer plugin {name!r}: adapters_to_train gave {strangers[0]!r}, not one of its learners "
                        f"({', '.join(sorted(learners))}); {FIX}")
    return adapters


def seated(adapters: list[Any], served: Collection[str], name: str, hook: str) -> list[Any]:
    """``adapters_for``'s (or ``eval_adapters_for``'s) answers, each seat on an adapter the run
    serves: a learner, or a snapshot or opponent it holds. The engine plays any other name as
    the base model, so a misspelt or retired one had played its games unseen."""
    for i, seats in enumerate(adapters):
        for role, adapter in seats.items():
            if adapter not in served:
                raise RunFailed(f"trainer plugin {name!r}: {hook} seated role {role!r} on {adapter!r} in episode {i}, "
                                f"an adapter the run does not serve ({', '.join(sorted(served))}); {FIX}")
    return adapters
