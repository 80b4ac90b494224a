"""bankledger: double-entry bookkeeping with accounts, transactions and reports."""

from .accounts import CREDIT, DEBIT, Account, AccountType
from .ledger import Entry, Ledger, LedgerError, StatementLine, Transaction, to_money
from .reports import BalanceSheet, IncomeStatement, balance_sheet, income_statement, trial_balance

__all__ = [
    "CREDIT",
    "DEBIT",
    "Account",
    "AccountType",
    "BalanceSheet",
    "Entry",
    "IncomeStatement",
    "Ledger",
    "LedgerError",
    "StatementLine",
    "Transaction",
    "balance_sheet",
    "income_statement",
    "to_money",
    "trial_balance",
]
__version__ = "0.9.0"
