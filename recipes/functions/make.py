"""Writes train.jsonl and heldout.jsonl: one-line Python functions for the code_pair recipe.

Each task family is a spec, a reference return expression and an input pool; the constant in a
spec differs between the splits, and four families appear only in held-out (a model must carry
what it learnt to specs it never trained on). Expected outputs come from the reference.

    python recipes/functions/make.py
"""
from __future__ import annotations

import json
import random
from pathlib import Path

INTS = [-7, -3, 0, 1, 2, 5, 8, 11, 14, 20]
WORDS = ["cat", "banana", "Hello", "a b c", "level", "Zebra", "tree house", "aaa", "python", "x"]
LISTS = [[3, 1, 2], [5], [4, 4, 1, 9], [-2, 7, 0], [10, 20, 30, 40], [6, -1], [2, 2, 2], [8, 3, 5, 1, 9]]

# (spec with {n} or {s}, reference with the same, input pool, needs a constant)
FAMILIES = [
    ("Return x plus {n}.", "x + {n}", INTS),
    ("Return x minus {n}.", "x - {n}", INTS),
    ("Return x times {n}.", "x * {n}", INTS),
    ("Return x modulo {n}.", "x % {n}", INTS),
    ("Return the larger of x and {n}.", "max(x, {n})", INTS),
    ("Return True if x is greater than {n}, else False.", "x > {n}", INTS),
    ("Return the square of x.", "x * x", INTS),
    ("Return x negated.", "-x", INTS),
    ("Return the absolute value of x.", "abs(x)", INTS),
    ("Return True if x is even, else False.", "x % 2 == 0", INTS),
    ("Return the string x in upper case.", "x.upper()", WORDS),
    ("Return the string x reversed.", "x[::-1]", WORDS),
    ("Return the length of the string x.", "len(x)", WORDS),
    ("Return the first character of the string x.", "x[0]", WORDS),
    ("Return the string x followed by '{s}'.", "x + '{s}'", WORDS),
    ("Return the string x repeated {n} times.", "x * {n}", WORDS),
    ("Return the sum of the list x.", "sum(x)", LISTS),
    ("Return the largest number in the list x.", "max(x)", LISTS),
    ("Return the number of items in the list x.", "len(x)", LISTS),
    ("Return the last item of the list x.", "x[-1]", LISTS),
]
HELD_OUT_FAMILIES = [
    ("Return x divided by {n}, rounded down.", "x // {n}", INTS),
    ("Return the string x in lower case.", "x.lower()", WORDS),
    ("Return the smallest number in the list x.", "min(x)", LISTS),
    ("Return the list x sorted from smallest to largest.", "sorted(x)", LISTS),
]
CONSTANTS = {"train": ([2, 3, 5, 7], ["!", "s"]), "heldout": ([4, 6], ["?"])}


def tasks(families, numbers, suffixes, rng: random.Random) -> list[dict]:
    out = []
    for spec, reference, pool in families:
        variants = [{}]
        if "{n}" in spec:
            variants = [{"n": n} for n in numbers]
        elif "{s}" in spec:
            variants = [{"s": s} for s in suffixes]
        for v in variants:
            ref = reference.format(**v)
            inputs = rng.sample(pool, 5)
            f = eval(f"lambda x: {ref}")  # our own reference, not a model's text
            out.append({"spec": spec.format(**v), "reference": ref,
                        "tests": [[x, f(x)] for x in inputs]})
    return out


def main() -> None:
    rng = random.Random(0)
    here = Path(__file__).parent
    numbers, suffixes = CONSTANTS["train"]
    train = tasks(FAMILIES, numbers, suffixes, rng)
    numbers, suffixes = CONSTANTS["heldout"]
    heldout = tasks(FAMILIES, numbers, suffixes, rng)
    heldout = [t for t in heldout if t["spec"] not in {x["spec"] for x in train}]  # new constants only
    heldout += tasks(HELD_OUT_FAMILIES, numbers, suffixes, rng)
    for name, rows in (("train", train), ("heldout", heldout)):
        (here / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"{name}: {len(rows)} tasks")


if __name__ == "__main__":
    main()
