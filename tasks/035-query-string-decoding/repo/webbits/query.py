def parse_query(qs: str) -> dict[str, list[str]]:
    """Parse 'a=1&b=2&a=3' into {'a': ['1', '3'], 'b': ['2']}; values are decoded."""
    out: dict[str, list[str]] = {}
    qs = qs.lstrip("?")
    for pair in qs.split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        out.setdefault(key, []).append(value)
    return out


def first(qs: str, key: str, default=None):
    return parse_query(qs).get(key, [default])[0]
