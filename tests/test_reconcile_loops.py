"""The reconciler's control loops: each runs on its own period, survives failed passes with a
backoff, and exports its passes, errors, period and last success."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchard.env.config import Settings
from orchard.env.metrics import Metrics
from orchard.env.service import ControlLoop, PartialPass, Reconciler
from tests.conftest import dedicated_orchestrator, needs_root, wait_until


def sample(metrics: Metrics, name: str, loop: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"loop": loop})


async def test_a_failing_pass_is_retried_after_a_backoff_and_the_loop_lives_on() -> None:
    metrics = Metrics()
    outcomes: list[Exception | None] = [RuntimeError("store down"), RuntimeError("store down"),
                                        None]
    waited: list[float] = []  # the wait before each pass
    recovered = asyncio.Event()

    async def flaky() -> None:
        waited.append(loop.delay())
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        recovered.set()

    loop = ControlLoop("flaky", 0.01, flaky, metrics, max_backoff=60)
    assert sample(metrics, "orchard_reconcile_passes_total", "flaky") == 0
    task = asyncio.create_task(loop.run())
    try:
        await asyncio.wait_for(recovered.wait(), 30)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert waited == [0.01, 0.02, 0.04]  # the period, then doubled per failure in a row
    assert sample(metrics, "orchard_reconcile_passes_total", "flaky") == 3
    assert sample(metrics, "orchard_reconcile_errors_total", "flaky") == 2
    assert sample(metrics, "orchard_reconcile_last_success_timestamp_seconds", "flaky") > 0
    assert loop.failures == 0 and loop.delay() == 0.01  # a success ends the backoff


def test_the_backoff_is_capped_but_never_below_the_period() -> None:
    async def noop() -> None: ...

    loop = ControlLoop("capped", 2, noop, Metrics(), max_backoff=30)
    loop.failures = 10
    assert loop.delay() == 30
    slow = ControlLoop("slow", 120, noop, Metrics(), max_backoff=30)
    slow.failures = 3
    assert slow.delay() == 120


async def test_a_partial_first_pass_starts_the_loops_and_a_failed_one_does_not() -> None:
    metrics = Metrics()

    async def partial() -> None:
        raise PartialPass("backend list failed")

    async def fine() -> None: ...

    async def broken() -> None:
        raise RuntimeError("store unreachable")

    started = Reconciler([ControlLoop("partial", 3600, partial, metrics, 60),
                          ControlLoop("fine", 3600, fine, metrics, 60)])
    await started.start()
    try:
        assert sample(metrics, "orchard_reconcile_errors_total", "partial") == 1
        assert sample(metrics, "orchard_reconcile_passes_total", "fine") == 1
        assert sample(metrics, "orchard_reconcile_last_success_timestamp_seconds",
                      "partial") == 0
        assert all(not t.done() for t in started._tasks)
    finally:
        await started.stop()
    with pytest.raises(RuntimeError, match="store unreachable"):
        await Reconciler([ControlLoop("broken", 3600, broken, metrics, 60)]).start()


def test_loop_periods_default_to_the_reconcile_interval() -> None:
    assert Settings(reconcile_interval=3).loop_periods() == {
        "sandboxes": 3, "jobs": 3, "snapshots": 3, "prune": 3, "pools": 3}
    assert Settings(reconcile_interval=3, job_reconcile_interval=1,
                    snapshot_reconcile_interval=2, prune_interval=60,
                    pool_interval=4).loop_periods() == {
        "sandboxes": 3, "jobs": 1, "snapshots": 2, "prune": 60, "pools": 4}


def scrape(http: httpx.Client) -> dict[tuple[str, str], float]:
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    return {(s.name, s.labels["loop"]): s.value
            for family in text_string_to_metric_families(r.text)
            for s in family.samples if family.name.startswith("orchard_reconcile")}


@needs_root
def test_each_loop_of_an_orchestrator_runs_on_its_own_period(data_dir: Path,
                                                             orchestrator: str) -> None:
    periods = {"sandboxes": 0.2, "jobs": 0.3, "snapshots": 0.4, "prune": 3600}
    with dedicated_orchestrator(data_dir, reconcile_interval=0.2, job_reconcile_interval=0.3,
                                snapshot_reconcile_interval=0.4, prune_interval=3600) as url, \
            httpx.Client(base_url=url, timeout=30) as http:
        for loop, period in periods.items():
            assert scrape(http)[("orchard_reconcile_period_seconds", loop)] == period

        def passes(loop: str) -> float:
            return scrape(http)[("orchard_reconcile_passes_total", loop)]

        assert wait_until(lambda: all(passes(loop) >= 3 for loop in periods if loop != "prune"),
                          60)
        metrics = scrape(http)
        # The prune loop ran its first pass at start, and its next is an hour away.
        assert metrics[("orchard_reconcile_passes_total", "prune")] == 1
        for loop in periods:
            assert metrics[("orchard_reconcile_errors_total", loop)] == 0
            assert metrics[("orchard_reconcile_last_success_timestamp_seconds", loop)] > 0
