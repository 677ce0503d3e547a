import pytest
from pager.paginate import Paginator, PageError


def test_exact_pages():
    p = Paginator(range(30), per_page=10)
    assert p.num_pages == 3
    assert p.page(3) == list(range(20, 30))


def test_empty_has_one_page():
    assert Paginator([]).page(1) == []


def test_out_of_range():
    with pytest.raises(PageError):
        Paginator(range(5), per_page=5).page(2)
