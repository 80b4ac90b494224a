"""Square-matrix algorithms: determinant, inverse, linear solve.

All of them use Gaussian elimination with partial pivoting on a float copy
of the matrix, so the input is never modified.
"""

from __future__ import annotations

from .matrix import Matrix, ShapeError, as_matrix

#: Pivots smaller than this (in absolute value) are treated as zero.
EPSILON = 1e-12


class SingularMatrixError(ValueError):
    """Raised when a matrix has no inverse."""


def _require_square(m: Matrix, what: str) -> int:
    if not m.is_square:
        raise ShapeError(f"{what} needs a square matrix, got {m.shape}")
    return m.shape[0]


def _pivot_row(rows: list[list[float]], col: int) -> int:
    """Index of the row (at or below ``col``) to use as pivot for ``col``.

    Partial pivoting: pick the candidate with the largest magnitude so that
    we never divide by a (near-)zero entry when a better one is available.
    """
    return max(range(col, len(rows)), key=lambda r: rows[r][col])


def determinant(matrix) -> float:
    """Determinant of a square matrix.

    >>> determinant([[1, 2], [3, 4]])
    -2.0
    """
    m = as_matrix(matrix)
    n = _require_square(m, "determinant")
    rows = [[float(x) for x in row] for row in m]
    det = 1.0
    for col in range(n):
        p = _pivot_row(rows, col)
        if abs(rows[p][col]) < EPSILON:
            return 0.0
        if p != col:
            rows[col], rows[p] = rows[p], rows[col]
            det = -det
        pivot = rows[col][col]
        det *= pivot
        for r in range(col + 1, n):
            factor = rows[r][col] / pivot
            if factor:
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col])]
    return det


def inverse(matrix) -> Matrix:
    """Inverse of a square matrix via Gauss-Jordan elimination.

    Raises :class:`SingularMatrixError` if the matrix is not invertible.
    """
    m = as_matrix(matrix)
    n = _require_square(m, "inverse")
    aug = [[float(x) for x in row] + [1.0 if i == j else 0.0 for j in range(n)]
           for i, row in enumerate(m)]
    for col in range(n):
        p = _pivot_row(aug, col)
        if abs(aug[p][col]) < EPSILON:
            raise SingularMatrixError("matrix is singular")
        aug[col], aug[p] = aug[p], aug[col]
        pivot = aug[col][col]
        aug[col] = [x / pivot for x in aug[col]]
        for r in range(n):
            if r != col and aug[r][col]:
                factor = aug[r][col]
                aug[r] = [a - factor * b for a, b in zip(aug[r], aug[col])]
    return Matrix(row[n:] for row in aug)


def solve(matrix, rhs) -> list[float]:
    """Solve ``matrix @ x = rhs`` for the vector ``x``."""
    m = as_matrix(matrix)
    n = _require_square(m, "solve")
    b = list(rhs)
    if len(b) != n:
        raise ShapeError(f"right-hand side has {len(b)} entries, expected {n}")
    x = inverse(m) @ Matrix([[v] for v in b])
    return list(x.column(0))


def trace(matrix) -> float:
    """Sum of the diagonal entries."""
    m = as_matrix(matrix)
    n = _require_square(m, "trace")
    return sum(m[i, i] for i in range(n))
