from .width import display_width, pad


def render_table(rows: list[list[str]], sep: str = " | ") -> str:
    if not rows:
        return ""
    ncols = max(len(r) for r in rows)
    rows = [list(r) + [""] * (ncols - len(r)) for r in rows]
    widths = [max(display_width(r[c]) for r in rows) for c in range(ncols)]
    lines = []
    for r in rows:
        cells = [pad(cell, widths[c]) for c, cell in enumerate(r)]
        lines.append(sep.join(cells).rstrip())
    return "\n".join(lines)
