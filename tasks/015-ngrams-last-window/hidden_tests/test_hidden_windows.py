from seqtools.windows import ngrams, count_bigrams


def test_bigrams_string():
    assert ngrams("abcd", 2) == ["ab", "bc", "cd"]


def test_full_length():
    assert ngrams("abc", 3) == ["abc"]


def test_list_unigrams():
    assert ngrams([1, 2, 3], 1) == [[1], [2], [3]]


def test_count_bigrams():
    c = count_bigrams("a b a b".split())
    assert c[("a", "b")] == 2 and c[("b", "a")] == 1


def test_short_empty():
    assert ngrams("", 1) == []
