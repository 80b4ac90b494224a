import pytest
from matrixlite import Matrix, ShapeError, SingularMatrixError, determinant, inverse, solve, trace


def test_determinant_2x2():
    assert determinant([[1, 2], [3, 4]]) == pytest.approx(-2.0)


def test_determinant_3x3():
    m = [[6, 1, 1], [4, -2, 5], [2, 8, 7]]
    assert determinant(m) == pytest.approx(-306.0)


def test_determinant_needs_row_swap():
    assert determinant([[1, 2], [5, 1]]) == pytest.approx(-9.0)


def test_determinant_singular_is_zero():
    assert determinant([[1, 2], [2, 4]]) == 0.0


def test_determinant_requires_square():
    with pytest.raises(ShapeError):
        determinant([[1, 2, 3]])


def test_inverse_roundtrip():
    m = Matrix([[4, 7], [2, 6]])
    inv = inverse(m)
    product = m @ inv
    for i in range(2):
        for j in range(2):
            assert product[i, j] == pytest.approx(1.0 if i == j else 0.0)


def test_inverse_singular():
    with pytest.raises(SingularMatrixError):
        inverse([[1, 2], [2, 4]])


def test_solve():
    x = solve([[2, 1], [1, 3]], [3, 5])
    assert x == pytest.approx([0.8, 1.4])


def test_trace():
    assert trace([[1, 2], [3, 4]]) == 5
