import pytest
from pager.paginate import Paginator, PageError


def test_partial_last_page_counted():
    assert Paginator(range(25), per_page=10).num_pages == 3


def test_partial_last_page_content():
    assert Paginator(range(25), per_page=10).page(3) == [20, 21, 22, 23, 24]


def test_fewer_items_than_page():
    p = Paginator(range(3), per_page=10)
    assert p.num_pages == 1
    assert p.page(1) == [0, 1, 2]


def test_has_next_before_partial_page():
    assert Paginator(range(11), per_page=5).has_next(2)


def test_still_rejects_page_zero():
    with pytest.raises(PageError):
        Paginator(range(10)).page(0)
