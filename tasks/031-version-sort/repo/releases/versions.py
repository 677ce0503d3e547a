def parse(version: str) -> tuple:
    """'v1.2.3' -> a key that orders versions correctly."""
    v = version.strip().lstrip("vV")
    parts = v.split(".")
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {version!r}")
    return tuple(parts)


def sort_versions(versions):
    return sorted(versions, key=parse)


def latest(versions):
    return max(versions, key=parse) if versions else None
