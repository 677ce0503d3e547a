import pytest
from stock.inventory import Inventory


def test_total():
    inv = Inventory()
    inv.add("a", 2, 1.5)
    inv.add("b", 1, 3.0)
    assert inv.total_value() == 6.0


def test_not_enough():
    inv = Inventory()
    inv.add("a", 1, 1.0)
    with pytest.raises(ValueError):
        inv.remove_qty("a", 2)
