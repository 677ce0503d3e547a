class Overpayment(ValueError):
    pass


class Invoice:
    def __init__(self, total: float):
        if total <= 0:
            raise ValueError("total must be positive")
        self.total = total
        self.payments: list[float] = []

    def paid(self) -> float:
        return sum(self.payments)

    def balance(self) -> float:
        return self.total - self.paid()

    def pay(self, amount: float) -> None:
        if amount <= 0:
            raise ValueError("amount must be positive")
        if amount > self.balance():
            raise Overpayment(f"{amount} exceeds balance {self.balance()}")
        self.payments.append(amount)

    def is_paid(self) -> bool:
        return self.balance() == 0
