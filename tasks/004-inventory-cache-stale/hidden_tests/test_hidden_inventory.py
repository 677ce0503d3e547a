from stock.inventory import Inventory


def test_total_after_price_change():
    inv = Inventory()
    inv.add("apple", 10, 0.5)
    assert inv.total_value() == 5.0
    inv.set_price("apple", 1.0)
    assert inv.total_value() == 10.0


def test_total_after_removal():
    inv = Inventory()
    inv.add("pear", 4, 2.0)
    assert inv.total_value() == 8.0
    inv.remove_qty("pear", 3)
    assert inv.total_value() == 2.0


def test_total_after_add():
    inv = Inventory()
    inv.add("a", 1, 1.0)
    inv.total_value()
    inv.add("b", 1, 2.0)
    assert inv.total_value() == 3.0


def test_quantity():
    inv = Inventory()
    inv.add("a", 5, 1.0)
    inv.remove_qty("a", 2)
    assert inv.quantity("a") == 3
