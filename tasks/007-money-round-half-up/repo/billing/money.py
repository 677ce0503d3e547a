"""Money helpers: amounts are floats or strings in, integer cents out."""
from decimal import Decimal, ROUND_HALF_UP


def to_cents(amount) -> int:
    """Round ``amount`` (in currency units) to whole cents, halves away from zero."""
    return int(round(float(amount) * 100))


def format_money(amount, symbol: str = "") -> str:
    cents = to_cents(amount)
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{symbol}{cents // 100}.{cents % 100:02d}"


def split_evenly(amount, parts: int) -> list[int]:
    """Split ``amount`` into ``parts`` cent amounts that add up exactly."""
    total = to_cents(amount)
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
