"""ISO 4217 minor units for the currencies we sell in."""

MINOR_UNITS = {
    "EUR": 2,
    "USD": 2,
    "GBP": 2,
    "KWD": 3,
    "BHD": 3,
}


def decimals(code: str) -> int:
    """Number of decimals of currency ``code`` (2 when unknown)."""
    return MINOR_UNITS.get(code.upper(), 2)


def is_known(code: str) -> bool:
    return code.upper() in MINOR_UNITS
