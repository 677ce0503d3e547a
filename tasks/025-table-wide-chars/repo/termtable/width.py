import unicodedata


def display_width(text: str) -> int:
    """Number of terminal columns ``text`` occupies."""
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 1
    return width


def pad(text: str, width: int) -> str:
    return text + " " * max(0, width - display_width(text))
