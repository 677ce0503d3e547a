import calendar
from datetime import date


def add_months(d: date, months: int) -> date:
    """Same day ``months`` later, clamped to the end of shorter months."""
    index = d.year * 12 + (d.month - 1) + months
    year, month = divmod(index, 12)
    return date(year, month + 1, d.day)


def renewal_dates(start: date, count: int) -> list[date]:
    return [add_months(start, i) for i in range(count)]
