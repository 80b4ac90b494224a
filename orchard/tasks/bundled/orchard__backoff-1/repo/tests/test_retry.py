import pytest

from backoff import Constant, Exponential, RetryError, retry, retry_call


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def flaky(failures, exc=ConnectionError):
    calls = {"n": 0}

    def func():
        calls["n"] += 1
        if calls["n"] <= failures:
            raise exc(f"failure {calls['n']}")
        return "ok"

    func.calls = calls
    return func


def test_succeeds_after_retries():
    clock = FakeClock()
    func = flaky(2)
    policy = Exponential(base=1, factor=2, jitter="none")
    assert retry_call(func, policy=policy, attempts=5, sleep=clock.sleep, clock=clock) == "ok"
    assert clock.sleeps == [1, 2]


def test_gives_up():
    clock = FakeClock()
    with pytest.raises(RetryError) as info:
        retry_call(flaky(10), policy=Constant(1), attempts=3, sleep=clock.sleep, clock=clock)
    assert info.value.attempts == 3
    assert isinstance(info.value.last_exception, ConnectionError)
    assert clock.sleeps == [1, 1]


def test_non_retryable_propagates():
    clock = FakeClock()
    with pytest.raises(KeyError):
        retry_call(flaky(1, KeyError), retry_on=(ConnectionError,), sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []


def test_deadline_stops_early():
    clock = FakeClock()
    policy = Exponential(base=1, factor=2, jitter="none")
    with pytest.raises(RetryError) as info:
        retry_call(flaky(10), policy=policy, attempts=10, deadline=5,
                   sleep=clock.sleep, clock=clock)
    # sleeps 1 + 2 = 3s; the next 4s sleep would end at 7s > 5s
    assert clock.sleeps == [1, 2]
    assert info.value.attempts == 3


def test_decorator_and_on_retry():
    clock = FakeClock()
    seen = []
    func = flaky(1)

    @retry(policy=Constant(0.25), attempts=3, sleep=clock.sleep, clock=clock,
           on_retry=lambda n, exc, d: seen.append((n, str(exc), d)))
    def wrapped():
        return func()

    assert wrapped() == "ok"
    assert seen == [(1, "failure 1", 0.25)]
