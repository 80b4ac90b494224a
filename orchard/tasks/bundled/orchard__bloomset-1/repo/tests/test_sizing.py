import math

import pytest

from bloomset import expected_error_rate, optimal_num_bits


def test_num_bits_for_one_percent():
    assert optimal_num_bits(1000, 0.01) == 9586


def test_num_bits_grows_with_stricter_rate():
    assert optimal_num_bits(1000, 0.001) > optimal_num_bits(1000, 0.01)


def test_invalid_sizing_arguments():
    with pytest.raises(ValueError):
        optimal_num_bits(0, 0.01)
    with pytest.raises(ValueError):
        optimal_num_bits(10, 1.5)


def test_expected_error_rate_formula():
    assert expected_error_rate(1000, 3, 100) == pytest.approx((1 - math.exp(-0.3)) ** 3)
    assert expected_error_rate(1000, 3, 0) == 0.0
