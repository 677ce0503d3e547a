class Inventory:
    def __init__(self):
        self._items = {}
        self._total = None

    def add(self, name, qty, price):
        if name in self._items:
            raise KeyError(f"{name} already stocked")
        self._items[name] = {"qty": qty, "price": price}
        self._total = None

    def set_price(self, name, price):
        self._items[name]["price"] = price

    def remove_qty(self, name, qty):
        item = self._items[name]
        if qty > item["qty"]:
            raise ValueError("not enough stock")
        item["qty"] -= qty

    def quantity(self, name):
        return self._items[name]["qty"]

    def total_value(self):
        if self._total is None:
            self._total = sum(i["qty"] * i["price"] for i in self._items.values())
        return self._total
