SMALL = {"a", "an", "and", "as", "at", "but", "by", "for", "in", "of", "on", "or", "the", "to"}


def headline(text: str) -> str:
    """Title-case ``text``, keeping small words lowercase except at the start."""
    words = text.split()
    out = []
    for i, word in enumerate(words):
        lower = word.lower()
        if i > 0 and lower in SMALL:
            out.append(lower)
        else:
            out.append(lower.title())
    return " ".join(out)
