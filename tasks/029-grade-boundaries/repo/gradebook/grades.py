from bisect import bisect_left

CUTOFFS = [60, 70, 80, 90]  # lower bounds of D, C, B, A
LETTERS = "FDCBA"


def letter(score: float) -> str:
    if not 0 <= score <= 100:
        raise ValueError(f"score out of range: {score}")
    return LETTERS[bisect_left(CUTOFFS, score)]


def distribution(scores):
    out = {l: 0 for l in LETTERS}
    for s in scores:
        out[letter(s)] += 1
    return out
