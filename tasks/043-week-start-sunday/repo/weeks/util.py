from datetime import date, timedelta


def week_start(d: date, first_weekday: int = 0) -> date:
    """First day (on or before ``d``) of the week containing ``d``; 0=Monday .. 6=Sunday."""
    if not 0 <= first_weekday <= 6:
        raise ValueError("first_weekday must be 0..6")
    return d - timedelta(days=d.weekday() - first_weekday)


def week_days(d: date, first_weekday: int = 0) -> list[date]:
    start = week_start(d, first_weekday)
    return [start + timedelta(days=i) for i in range(7)]
