from collections import deque


def moving_average(values, window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    if window < 1:
        raise ValueError("window must be >= 1")
    buf = deque(maxlen=window)
    out = []
    total = 0.0
    for v in values:
        if len(buf) == window:
            total -= buf[0]
        buf.append(v)
        total += v
        out.append(total / window)
    return out
