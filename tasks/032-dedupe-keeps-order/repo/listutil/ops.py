def unique(items, key=None):
    """Items without duplicates, keeping the first occurrence and the original order."""
    if key is None:
        return list(set(items))
    seen = {}
    for item in items:
        seen.setdefault(key(item), item)
    return list(seen.values())


def flatten(nested):
    return [x for sub in nested for x in sub]
