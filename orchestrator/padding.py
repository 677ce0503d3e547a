"""Rows of unequal length batched so that their padding stays cheap.

A padded position costs what a real token costs, in the engine's prefill and in a training pass
alike, so one long row in a batch of short ones makes every short one pay for its length.
"""
from __future__ import annotations


def length_batches(lengths: list[int], slack: int = 64) -> list[list[int]]:
    """Indices grouped by length, longest first: a row joins the current batch unless padding it
    to the batch's longest would waste more than its own length and more than ``slack`` tokens
    (what a separate forward pass costs, roughly)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        longest = lengths[batches[-1][0]] if batches else 0
        if batches and longest - lengths[i] <= max(lengths[i], slack):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches
