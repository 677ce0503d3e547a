from datetime import date, timedelta


def date_range(start: date, end: date, step: int = 1):
    """Yield every ``step``-th date from ``start`` to ``end``, both included."""
    if step < 1:
        raise ValueError("step must be positive")
    days = (end - start).days
    for offset in range(0, days, step):
        yield start + timedelta(days=offset)


def count_weekdays(start: date, end: date) -> int:
    """Number of Monday..Friday dates from ``start`` to ``end`` (inclusive)."""
    return sum(1 for d in date_range(start, end) if d.weekday() < 5)
