import pytest
from invoicing.invoice import Invoice, Overpayment


def test_instalments_paid():
    inv = Invoice(0.3)
    for _ in range(3):
        inv.pay(0.1)
    assert inv.is_paid()


def test_balance_zero():
    inv = Invoice(0.3)
    for _ in range(3):
        inv.pay(0.1)
    assert inv.balance() == 0.0


def test_last_cent_not_overpayment():
    inv = Invoice(1.0)
    for _ in range(7):
        inv.pay(0.1)
    inv.pay(0.3)
    assert inv.is_paid()


def test_partial():
    inv = Invoice(100)
    inv.pay(40)
    assert not inv.is_paid() and inv.balance() == 60


def test_still_rejects_overpay():
    inv = Invoice(1.0)
    inv.pay(0.5)
    with pytest.raises(Overpayment):
        inv.pay(0.51)
