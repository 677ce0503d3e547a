def merge(intervals):
    """Merge closed intervals [start, end]; returns a sorted list of disjoint tuples."""
    out = []
    for start, end in sorted(intervals):
        if start > end:
            raise ValueError(f"bad interval {(start, end)}")
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total_length(intervals):
    return sum(e - s for s, e in merge(intervals))


def covers(intervals, start, end):
    """True when [start, end] lies inside one merged interval."""
    return any(s <= start and end <= e for s, e in merge(intervals))
