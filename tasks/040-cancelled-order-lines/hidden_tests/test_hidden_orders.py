from orders.models import Order
from orders.summary import summarize


def make():
    o = Order("A-1")
    o.add_line("mug", 2, 8.0)
    poster = o.add_line("poster", 1, 15.0)
    o.cancel_line(poster)
    return o


def test_total_excludes_cancelled():
    assert make().total() == 16.0


def test_items_exclude_cancelled():
    assert summarize(make())["items"] == 2


def test_cancelled_count():
    assert summarize(make())["cancelled"] == 1


def test_all_cancelled():
    o = Order("B")
    o.cancel_line(o.add_line("x", 4, 2.5))
    s = summarize(o)
    assert (s["total"], s["items"], s["lines"]) == (0, 0, 1)
