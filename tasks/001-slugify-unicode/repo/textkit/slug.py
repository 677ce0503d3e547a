"""URL slugs."""
import re
import unicodedata

_NON_WORD = re.compile(r"[^a-z0-9]+")


def slugify(text: str, sep: str = "-", max_len: int | None = None) -> str:
    """Lowercase ASCII slug of ``text``; runs of other characters become ``sep``."""
    text = text.encode("ascii", "ignore").decode("ascii")
    slug = _NON_WORD.sub(sep, text.lower()).strip(sep)
    if max_len is not None:
        slug = slug[:max_len].rstrip(sep)
    return slug


def unique_slug(text: str, taken: set[str]) -> str:
    base = slugify(text)
    slug, n = base, 2
    while slug in taken:
        slug = f"{base}-{n}"
        n += 1
    return slug
