import pytest

from moneycalc import Bill, Money


def make_bill():
    bill = Bill(["ann", "bob", "cy"], tax_percent=8, tip_percent=15)
    bill.add("pizza", "24.00")
    bill.add("wine", "31.50", "ann", "bob")
    bill.add("salad", "9.25", "cy")
    return bill


def test_totals():
    bill = make_bill()
    assert bill.subtotal == Money("64.75")
    assert bill.tax == Money("5.18")
    assert bill.tip == Money("9.71")
    assert bill.total == Money("79.64")


def test_shares_add_up_to_total():
    bill = make_bill()
    shares = bill.shares()
    assert shares == {"ann": Money("29.22"), "bob": Money("29.21"), "cy": Money("21.21")}
    assert sum(shares.values()) == bill.total


def test_personal_items_only():
    bill = Bill(["ann", "bob"], currency="EUR")
    bill.add("coffee", "3.20", "ann")
    assert bill.shares() == {"ann": Money("3.20", "EUR"), "bob": Money(0, "EUR")}


def test_validation():
    with pytest.raises(ValueError):
        Bill([])
    with pytest.raises(ValueError):
        Bill(["ann", "ann"])
    bill = Bill(["ann"])
    with pytest.raises(ValueError):
        bill.add("tea", "2", "zoe")
