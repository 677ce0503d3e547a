from dataclasses import dataclass, field


@dataclass
class Line:
    sku: str
    qty: int
    unit_price: float
    cancelled: bool = False

    @property
    def amount(self) -> float:
        return self.qty * self.unit_price


@dataclass
class Order:
    ref: str
    lines: list[Line] = field(default_factory=list)

    def add_line(self, sku, qty, unit_price) -> Line:
        if qty < 1:
            raise ValueError("qty must be >= 1")
        line = Line(sku, qty, unit_price)
        self.lines.append(line)
        return line

    def cancel_line(self, line: Line) -> None:
        line.cancelled = True

    def total(self) -> float:
        return round(sum(l.amount for l in self.lines), 2)
