import pytest

from eventsched import ManualClock, Scheduler


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def sched(clock):
    return Scheduler(clock)


def test_runs_due_events_in_time_order(clock, sched):
    log = []
    sched.schedule(5, log.append, "b")
    sched.schedule(2, log.append, "a")
    sched.schedule(9, log.append, "c")
    clock.advance(5)
    assert sched.run_pending() == 2
    assert log == ["a", "b"]
    assert len(sched) == 1 and sched.next_time() == 9


def test_priority_then_insertion_order(clock, sched):
    log = []
    sched.schedule(1, log.append, "low", priority=5)
    sched.schedule(1, log.append, "first")
    sched.schedule(1, log.append, "second")
    sched.schedule(1, log.append, "urgent", priority=-1)
    clock.advance(1)
    sched.run_pending()
    assert log == ["urgent", "first", "second", "low"]


def test_schedule_in_and_kwargs(clock, sched):
    seen = {}
    clock.advance(10)
    event = sched.schedule_in(3, seen.update, answer=42)
    assert event.time == 13
    clock.advance(3)
    sched.run_pending()
    assert seen == {"answer": 42} and event.state == "done"
    with pytest.raises(ValueError):
        sched.schedule_in(-1, print)


def test_cancel(clock, sched):
    log = []
    keep = sched.schedule(1, log.append, "keep")
    drop = sched.schedule(1, log.append, "drop")
    assert sched.cancel(drop)
    assert not sched.cancel(drop)
    assert len(sched) == 1
    assert sched.pending() == [keep]
    clock.advance(1)
    assert sched.run_pending() == 1
    assert log == ["keep"]
    assert not sched.cancel(keep)


def test_callbacks_can_schedule_more(clock, sched):
    log = []

    def tick(n):
        log.append(n)
        if n < 3:
            sched.schedule(clock(), tick, n + 1)

    sched.schedule(0, tick, 1)
    assert sched.run_pending() == 3
    assert log == [1, 2, 3]


def test_exception_leaves_later_events_pending(clock, sched):
    def boom():
        raise RuntimeError("boom")

    log = []
    sched.schedule(0, boom)
    sched.schedule(0, log.append, "after")
    with pytest.raises(RuntimeError):
        sched.run_pending()
    assert len(sched) == 1
    sched.run_pending()
    assert log == ["after"]


def test_next_time_skips_cancelled(sched):
    first = sched.schedule(1, print)
    sched.schedule(4, print)
    sched.cancel(first)
    assert sched.next_time() == 4
    assert repr(sched.pending()[0]) == "<Event print at 4 prio 0 pending>"
