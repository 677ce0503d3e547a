def truncate(text: str, limit: int, ellipsis: str = "...") -> str:
    """Shorten ``text`` to at most ``limit`` characters, ending with ``ellipsis`` if cut."""
    if limit < len(ellipsis):
        raise ValueError("limit shorter than the ellipsis")
    if len(text) <= limit:
        return text
    return text[:limit] + ellipsis


def truncate_words(text: str, max_words: int) -> str:
    words = text.split()
    if len(words) <= max_words:
        return " ".join(words)
    return " ".join(words[:max_words]) + " ..."
