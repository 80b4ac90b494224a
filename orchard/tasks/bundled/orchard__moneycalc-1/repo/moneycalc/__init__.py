"""moneycalc: currency amounts, allocation and bill splitting."""

from .bill import Bill
from .currency import CURRENCIES, Currency, get_currency
from .money import CurrencyMismatchError, Money

__all__ = ["Bill", "CURRENCIES", "Currency", "CurrencyMismatchError", "Money", "get_currency"]
