import random

import pytest

from backoff import Constant, Exponential


def test_constant():
    assert list(Constant(1.5).delays(3)) == [1.5, 1.5, 1.5]


def test_exponential_without_jitter():
    p = Exponential(base=0.5, factor=2, max_delay=5, jitter="none")
    assert list(p.delays(6)) == [0.5, 1.0, 2.0, 4.0, 5, 5]


def test_full_jitter_within_ceiling():
    p = Exponential(base=1, factor=2, max_delay=30, jitter="full", rng=random.Random(3))
    for n in range(8):
        d = p.delay(n)
        assert 0 <= d <= p.ceiling(n)


def test_seeded_rng_is_reproducible():
    a = Exponential(base=1, factor=3, max_delay=100, rng=random.Random(42))
    b = Exponential(base=1, factor=3, max_delay=100, rng=random.Random(42))
    assert list(a.delays(5)) == list(b.delays(5))


def test_invalid_arguments():
    with pytest.raises(ValueError):
        Exponential(base=0)
    with pytest.raises(ValueError):
        Exponential(jitter="decorrelated")
    with pytest.raises(ValueError):
        Exponential(base=2, max_delay=1)
    with pytest.raises(ValueError):
        Exponential().ceiling(-1)
