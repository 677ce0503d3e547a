def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap; words longer than ``width`` get a line of their own."""
    if width < 1:
        raise ValueError("width must be positive")
    lines: list[str] = []
    cur = ""
    for word in text.split():
        if len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        lines.append(cur)
    return lines


def fill(text: str, width: int) -> str:
    return "\n".join(wrap(text, width))
