import pytest

from ratelimit import ManualClock, SlidingWindowLog


def test_window_allows_up_to_limit():
    limiter = SlidingWindowLog(limit=3, window=10, clock=ManualClock())
    assert [limiter.allow() for _ in range(4)] == [True, True, True, False]
    assert limiter.remaining() == 0


def test_window_slides():
    clock = ManualClock()
    limiter = SlidingWindowLog(limit=2, window=10, clock=clock)
    assert limiter.allow()
    clock.advance(4)
    assert limiter.allow()
    clock.advance(5)
    assert not limiter.allow()
    clock.advance(1.5)  # t=10.5: the event at t=0 has left the window
    assert limiter.remaining() == 1
    assert limiter.allow()
    assert not limiter.allow()


def test_denied_events_are_not_recorded():
    clock = ManualClock()
    limiter = SlidingWindowLog(limit=1, window=5, clock=clock)
    assert limiter.allow()
    clock.advance(3)
    assert not limiter.allow()
    clock.advance(2.5)
    assert limiter.allow()


def test_retry_after():
    clock = ManualClock()
    limiter = SlidingWindowLog(limit=2, window=10, clock=clock)
    assert limiter.retry_after() == 0
    limiter.allow()
    clock.advance(3)
    limiter.allow()
    assert limiter.retry_after() == 7


def test_reset_and_validation():
    limiter = SlidingWindowLog(limit=1, window=1, clock=ManualClock())
    limiter.allow()
    limiter.reset()
    assert limiter.allow()
    with pytest.raises(ValueError):
        SlidingWindowLog(limit=0, window=1)
    with pytest.raises(ValueError):
        SlidingWindowLog(limit=1, window=0)
