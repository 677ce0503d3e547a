def as_percentages(counts: dict[str, int]) -> dict[str, int]:
    """Whole-number percentages per option that always total exactly 100.

    Uses the largest-remainder method; ties go to the option listed first.
    An empty or all-zero survey gives 0 for every option.
    """
    total = sum(counts.values())
    if total == 0:
        return {k: 0 for k in counts}
    return {k: round(v * 100 / total) for k, v in counts.items()}


def winner(counts: dict[str, int]):
    return max(counts, key=counts.get) if counts else None
