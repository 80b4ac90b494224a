"""Transactions and the ledger that records them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from typing import Iterable, Optional, Union

from .accounts import DEBIT, Account, AccountType

CENT = Decimal("0.01")
Amount = Union[Decimal, int, str]


class LedgerError(ValueError):
    """Raised for unbalanced transactions, unknown accounts and the like."""


def to_money(value: Amount) -> Decimal:
    """``value`` as a :class:`Decimal` rounded half-up to cents.

    Floats are rejected: ``0.1 + 0.2`` has no place in a ledger.
    """
    if isinstance(value, float):
        raise TypeError("use Decimal, int or str amounts, not float")
    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class Entry:
    """One line of a transaction: a debit *or* a credit to ``account``."""

    account: str
    debit: Decimal = Decimal("0.00")
    credit: Decimal = Decimal("0.00")

    @classmethod
    def dr(cls, account: str, amount: Amount) -> "Entry":
        return cls(account, debit=to_money(amount))

    @classmethod
    def cr(cls, account: str, amount: Amount) -> "Entry":
        return cls(account, credit=to_money(amount))


@dataclass(frozen=True)
class Transaction:
    """A dated, balanced set of entries."""

    date: date
    description: str
    entries: tuple[Entry, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(self.entries))
        if len(self.entries) < 2:
            raise LedgerError("a transaction needs at least two entries")
        for entry in self.entries:
            if entry.debit < 0 or entry.credit < 0:
                raise LedgerError("entry amounts must not be negative")
            if (entry.debit > 0) == (entry.credit > 0):
                raise LedgerError("each entry must be either a debit or a credit")
        debits = sum(e.debit for e in self.entries)
        credits = sum(e.credit for e in self.entries)
        if debits != credits:
            raise LedgerError(f"unbalanced transaction: debits {debits} != credits {credits}")

    @property
    def amount(self) -> Decimal:
        return sum((e.debit for e in self.entries), Decimal("0.00"))


@dataclass(frozen=True)
class StatementLine:
    date: date
    description: str
    debit: Decimal
    credit: Decimal
    balance: Decimal


class Ledger:
    """Accounts plus the transactions posted to them, in posting order."""

    def __init__(self) -> None:
        self.accounts: dict[str, Account] = {}
        self.transactions: list[Transaction] = []

    def open(self, name: str, type: AccountType) -> Account:
        """Open a new account."""
        if name in self.accounts:
            raise LedgerError(f"account {name!r} already exists")
        account = Account(name, type)
        self.accounts[name] = account
        return account

    def account(self, name: str) -> Account:
        try:
            return self.accounts[name]
        except KeyError:
            raise LedgerError(f"unknown account {name!r}") from None

    def post(self, when: date, description: str, entries: Iterable[Entry]) -> Transaction:
        """Record a balanced transaction; every account must be open."""
        transaction = Transaction(when, description, tuple(entries))
        for entry in transaction.entries:
            self.account(entry.account)
        self.transactions.append(transaction)
        return transaction

    def transfer(self, when: date, description: str, debit: str, credit: str,
                 amount: Amount) -> Transaction:
        """Shortcut for a two-entry transaction."""
        return self.post(when, description, [Entry.dr(debit, amount), Entry.cr(credit, amount)])

    def _entries(self, name: str, start: Optional[date] = None, end: Optional[date] = None):
        for transaction in sorted(self.transactions, key=lambda t: t.date):
            if start is not None and transaction.date < start:
                continue
            if end is not None and transaction.date > end:
                continue
            for entry in transaction.entries:
                if entry.account == name:
                    yield transaction, entry

    @staticmethod
    def _signed(account: Account, debit: Decimal, credit: Decimal) -> Decimal:
        """A movement expressed on the account's normal side (increase = positive)."""
        return debit - credit if account.normal_balance == DEBIT else credit - debit

    def balance(self, name: str, as_of: Optional[date] = None,
                since: Optional[date] = None) -> Decimal:
        """Balance of ``name`` on its normal side, from ``since`` up to ``as_of`` (inclusive)."""
        account = self.account(name)
        total = Decimal("0.00")
        for _, entry in self._entries(name, since, as_of):
            total += self._signed(account, entry.debit, entry.credit)
        return total

    def balances(self, as_of: Optional[date] = None) -> dict[str, Decimal]:
        return {name: self.balance(name, as_of) for name in self.accounts}

    def statement(self, name: str, start: Optional[date] = None,
                  end: Optional[date] = None) -> list[StatementLine]:
        """Lines for ``name`` between ``start`` and ``end`` with a running balance.

        The running balance starts from the balance before ``start``.
        """
        account = self.account(name)
        running = Decimal("0.00")
        if start is not None:
            running = sum(
                (self._signed(account, e.debit, e.credit)
                 for t, e in self._entries(name) if t.date < start),
                Decimal("0.00"),
            )
        lines = []
        for transaction, entry in self._entries(name, start, end):
            running += self._signed(account, entry.debit, entry.credit)
            lines.append(StatementLine(transaction.date, transaction.description,
                                       entry.debit, entry.credit, running))
        return lines
