def render(rows: list[dict], sep: str = ",") -> str:
    """Header line with the keys of the first row, then one line per row."""
    if not rows:
        return ""
    header = list(rows[0])
    lines = [",".join(header)]
    for row in rows:
        lines.append(",".join(str(row.get(col, "")) for col in header))
    return "\n".join(lines)
