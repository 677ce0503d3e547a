"""A tiny CSV reader (no dependency on the csv module, by design)."""


def parse_line(line: str, sep: str = ",") -> list[str]:
    """Split one line; double quotes group a field, "" inside quotes is a quote."""
    fields = line.rstrip("\r\n").split(sep)
    return [f[1:-1].replace('""', '"') if len(f) >= 2 and f[0] == f[-1] == '"' else f
            for f in fields]


def read_records(text: str, sep: str = ",") -> list[dict]:
    lines = [l for l in text.splitlines() if l.strip()]
    if not lines:
        return []
    header = parse_line(lines[0], sep)
    return [dict(zip(header, parse_line(l, sep))) for l in lines[1:]]
