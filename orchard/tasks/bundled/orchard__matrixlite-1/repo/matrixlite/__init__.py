"""matrixlite: small dense matrix operations in pure Python."""

from .linalg import SingularMatrixError, determinant, inverse, solve, trace
from .matrix import Matrix, ShapeError

__all__ = [
    "Matrix",
    "ShapeError",
    "SingularMatrixError",
    "determinant",
    "inverse",
    "solve",
    "trace",
]
__version__ = "0.3.1"
