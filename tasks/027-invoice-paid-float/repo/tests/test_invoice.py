import pytest
from invoicing.invoice import Invoice, Overpayment


def test_single_payment():
    inv = Invoice(0.3)
    inv.pay(0.3)
    assert inv.is_paid()


def test_overpay():
    inv = Invoice(10)
    with pytest.raises(Overpayment):
        inv.pay(11)
