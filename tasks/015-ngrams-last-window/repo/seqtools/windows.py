from collections import Counter


def ngrams(seq, n):
    """All contiguous windows of length ``n``, as slices of ``seq``."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return [seq[i:i + n] for i in range(len(seq) - n)]


def count_bigrams(words):
    return Counter(tuple(w) for w in ngrams(list(words), 2))
