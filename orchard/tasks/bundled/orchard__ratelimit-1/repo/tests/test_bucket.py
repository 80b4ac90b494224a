import pytest

from ratelimit import ManualClock, TokenBucket


def test_bucket_starts_full_and_allows_a_burst():
    bucket = TokenBucket(rate=1, capacity=3, clock=ManualClock())
    assert [bucket.try_acquire() for _ in range(4)] == [True, True, True, False]


def test_bucket_refills_at_rate_up_to_capacity():
    clock = ManualClock()
    bucket = TokenBucket(rate=2, capacity=4, clock=clock)
    assert bucket.try_acquire(4)
    clock.advance(1)
    assert bucket.tokens == 2
    clock.advance(100)
    assert bucket.tokens == 4


def test_bucket_wait_time():
    clock = ManualClock()
    bucket = TokenBucket(rate=0.5, capacity=2, clock=clock)
    assert bucket.wait_time() == 0
    assert bucket.try_acquire(2)
    assert bucket.wait_time() == 2.0
    clock.advance(2)
    assert bucket.try_acquire()


def test_bucket_rejects_impossible_requests():
    bucket = TokenBucket(rate=1, capacity=2, clock=ManualClock())
    with pytest.raises(ValueError, match="capacity 2"):
        bucket.try_acquire(3)
    with pytest.raises(ValueError):
        bucket.wait_time(0)
    with pytest.raises(ValueError):
        TokenBucket(rate=0, capacity=1)
