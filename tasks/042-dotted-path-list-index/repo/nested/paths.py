_MISSING = object()


def get_path(data, path: str, default=None):
    """Look up 'a.b.c' in nested dicts/lists; numeric parts index into lists."""
    cur = data
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return default
    return cur


def has_path(data, path: str) -> bool:
    return get_path(data, path, _MISSING) is not _MISSING
