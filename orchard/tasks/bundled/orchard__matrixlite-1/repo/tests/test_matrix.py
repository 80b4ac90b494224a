import pytest
from matrixlite import Matrix, ShapeError


def test_shape_and_indexing():
    m = Matrix([[1, 2, 3], [4, 5, 6]])
    assert m.shape == (2, 3)
    assert m[1, 2] == 6
    assert m.column(1) == (2, 5)
    assert not m.is_square


def test_ragged_rows_rejected():
    with pytest.raises(ShapeError):
        Matrix([[1, 2], [3]])


def test_transpose():
    m = Matrix([[1, 2, 3], [4, 5, 6]])
    assert m.transpose() == Matrix([[1, 4], [2, 5], [3, 6]])
    assert m == m.T.T


def test_matmul():
    a = Matrix([[1, 2], [3, 4]])
    b = Matrix([[5, 6], [7, 8]])
    assert a @ b == Matrix([[19, 22], [43, 50]])
    assert a @ Matrix.identity(2) == a


def test_matmul_rectangular():
    a = Matrix([[1, 2, 3]])
    b = Matrix([[1], [2], [3]])
    assert a @ b == Matrix([[14]])
    assert (b @ a).shape == (3, 3)
    with pytest.raises(ShapeError):
        a @ a


def test_add_sub_scale():
    a = Matrix([[1, 2], [3, 4]])
    assert a + a == 2 * a
    assert a - a == Matrix.zeros(2, 2)
    assert -a == a * -1
