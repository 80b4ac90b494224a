"""The :class:`Matrix` type: an immutable, row-major grid of numbers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from numbers import Number


class ShapeError(ValueError):
    """Raised when matrix dimensions do not fit the requested operation."""


class Matrix:
    """An immutable dense matrix stored as a tuple of row tuples.

    >>> m = Matrix([[1, 2], [3, 4]])
    >>> m.shape
    (2, 2)
    >>> (m @ Matrix.identity(2)) == m
    True
    """

    __slots__ = ("_rows",)

    def __init__(self, rows: Iterable[Iterable[Number]]):
        data = tuple(tuple(row) for row in rows)
        if not data or not data[0]:
            raise ShapeError("a matrix needs at least one row and one column")
        width = len(data[0])
        if any(len(row) != width for row in data):
            raise ShapeError("all rows must have the same length")
        self._rows = data

    # -- constructors -----------------------------------------------------
    @classmethod
    def zeros(cls, n_rows: int, n_cols: int) -> Matrix:
        """A matrix of the given shape filled with ``0``."""
        return cls([[0] * n_cols for _ in range(n_rows)])

    @classmethod
    def identity(cls, n: int) -> Matrix:
        """The ``n`` x ``n`` identity matrix."""
        return cls([[1 if i == j else 0 for j in range(n)] for i in range(n)])

    # -- basic accessors --------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, columns)``."""
        return len(self._rows), len(self._rows[0])

    @property
    def is_square(self) -> bool:
        n_rows, n_cols = self.shape
        return n_rows == n_cols

    def rows(self) -> list[list[Number]]:
        """A fresh, mutable copy of the rows."""
        return [list(row) for row in self._rows]

    def row(self, i: int) -> tuple[Number, ...]:
        return self._rows[i]

    def column(self, j: int) -> tuple[Number, ...]:
        return tuple(row[j] for row in self._rows)

    def __getitem__(self, index: tuple[int, int]) -> Number:
        i, j = index
        return self._rows[i][j]

    def __iter__(self) -> Iterator[tuple[Number, ...]]:
        return iter(self._rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Matrix):
            return NotImplemented
        return self._rows == other._rows

    def __hash__(self) -> int:
        return hash(self._rows)

    def __repr__(self) -> str:
        return f"Matrix({[list(r) for r in self._rows]!r})"

    # -- arithmetic -------------------------------------------------------
    def _check_same_shape(self, other: Matrix) -> None:
        if self.shape != other.shape:
            raise ShapeError(f"shape mismatch: {self.shape} vs {other.shape}")

    def __add__(self, other: Matrix) -> Matrix:
        if not isinstance(other, Matrix):
            return NotImplemented
        self._check_same_shape(other)
        return Matrix(
            [a + b for a, b in zip(ra, rb)] for ra, rb in zip(self._rows, other._rows)
        )

    def __sub__(self, other: Matrix) -> Matrix:
        if not isinstance(other, Matrix):
            return NotImplemented
        self._check_same_shape(other)
        return Matrix(
            [a - b for a, b in zip(ra, rb)] for ra, rb in zip(self._rows, other._rows)
        )

    def __neg__(self) -> Matrix:
        return self.scale(-1)

    def scale(self, k: Number) -> Matrix:
        """Multiply every entry by the scalar ``k``."""
        return Matrix([k * x for x in row] for row in self._rows)

    def __mul__(self, k: Number) -> Matrix:
        if isinstance(k, Matrix):
            raise TypeError("use '@' for matrix multiplication")
        return self.scale(k)

    __rmul__ = __mul__

    def __matmul__(self, other: Matrix) -> Matrix:
        if not isinstance(other, Matrix):
            return NotImplemented
        n, m = self.shape
        m2, p = other.shape
        if m != m2:
            raise ShapeError(f"cannot multiply {self.shape} by {other.shape}")
        cols = [other.column(j) for j in range(p)]
        return Matrix(
            [sum(a * b for a, b in zip(row, col)) for col in cols] for row in self._rows
        )

    def transpose(self) -> Matrix:
        """Rows become columns."""
        return Matrix(zip(*self._rows))

    @property
    def T(self) -> Matrix:
        return self.transpose()

    def map(self, func) -> Matrix:
        """Apply ``func`` to every entry."""
        return Matrix([func(x) for x in row] for row in self._rows)


def as_matrix(value: Matrix | Sequence[Sequence[Number]]) -> Matrix:
    """Accept either a :class:`Matrix` or nested sequences."""
    return value if isinstance(value, Matrix) else Matrix(value)
