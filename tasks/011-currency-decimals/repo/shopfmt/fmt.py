from decimal import Decimal, ROUND_HALF_UP

from .currencies import decimals


def quantize(amount, code: str) -> Decimal:
    places = decimals(code)
    step = Decimal(1).scaleb(-places)
    return Decimal(str(amount)).quantize(step, rounding=ROUND_HALF_UP)


def format_amount(amount, code: str) -> str:
    value = Decimal(str(amount)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    return f"{code.upper()} {value:,.2f}"
