import pytest
from seqtools.windows import ngrams


def test_too_short():
    assert ngrams("ab", 3) == []


def test_bad_n():
    with pytest.raises(ValueError):
        ngrams("ab", 0)
