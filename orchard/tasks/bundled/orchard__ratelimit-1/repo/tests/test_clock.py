import pytest

from ratelimit import ManualClock


def test_manual_clock_moves_forward_only():
    clock = ManualClock(5)
    clock.advance(2.5)
    assert clock() == 7.5
    clock.set(10)
    assert clock() == 10.0
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.set(9)
