import pytest
from orders.models import Order
from orders.summary import summarize


def test_total():
    o = Order("x")
    o.add_line("a", 2, 1.25)
    o.add_line("b", 1, 0.1)
    assert o.total() == 2.6


def test_summary_basic():
    o = Order("x")
    o.add_line("a", 3, 1.0)
    assert summarize(o) == {"ref": "x", "lines": 1, "items": 3, "cancelled": 0, "total": 3.0}


def test_qty():
    with pytest.raises(ValueError):
        Order("x").add_line("a", 0, 1.0)
