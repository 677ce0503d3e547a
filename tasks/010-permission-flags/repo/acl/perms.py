READ = 1
WRITE = 2
DELETE = 4
ADMIN = 8
ALL = READ | WRITE | DELETE | ADMIN
NAMES = {"read": READ, "write": WRITE, "delete": DELETE, "admin": ADMIN}


def parse(spec: str) -> int:
    """'read,write' -> READ | WRITE."""
    value = 0
    for part in spec.split(","):
        part = part.strip().lower()
        if part:
            value |= NAMES[part]
    return value


def has_permission(granted: int, needed: int) -> bool:
    """True when every flag in ``needed`` is present in ``granted``."""
    return granted & needed != 0


def describe(granted: int) -> str:
    return ",".join(name for name, flag in NAMES.items() if has_permission(granted, flag))
