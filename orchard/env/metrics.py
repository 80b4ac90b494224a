"""Prometheus metrics, on a registry per app so several orchestrators can share a process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_FAST = (0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.creates = Counter("orchard_sandbox_creates", "Sandbox creates by outcome",
                               ["outcome"], registry=r)
        self.create_seconds = Histogram("orchard_sandbox_create_seconds", "Create to ready",
                                        buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
                                        registry=r)
        self.execs = Counter("orchard_execs", "Exec calls by outcome", ["outcome"], registry=r)
        self.exec_seconds = Histogram("orchard_exec_seconds", "Exec round-trip in the service",
                                      buckets=_FAST, registry=r)
        self.rejected = Counter("orchard_admission_rejections", "503s from admission control",
                                registry=r)
        self.live = Gauge("orchard_sandboxes_live", "Pending or running sandboxes", registry=r)
        self.events_lost = Counter("orchard_events_lost", "Sandbox events the store refused",
                                   registry=r)
        self.in_flight = Gauge("orchard_creates_in_flight", "Creates in progress", registry=r)
        # One series per reconcile loop (label "loop"): see orchard/env/service/reconciler.py.
        self.loop_passes = Counter("orchard_reconcile_passes", "Reconcile passes run, by loop",
                                   ["loop"], registry=r)
        self.loop_errors = Counter("orchard_reconcile_errors",
                                   "Reconcile passes that failed or were partial, by loop",
                                   ["loop"], registry=r)
        self.loop_period = Gauge("orchard_reconcile_period_seconds",
                                 "Seconds between the loop's passes, as configured", ["loop"],
                                 registry=r)
        self.loop_last_success = Gauge("orchard_reconcile_last_success_timestamp_seconds",
                                       "Unix time of the loop's last complete pass (0: none "
                                       "yet)", ["loop"], registry=r)
        # One series per warm pool (label "pool"): see orchard/env/service/pools.py.
        self.pool_size = Gauge("orchard_pool_size", "Sandboxes the pool keeps ready (target)",
                               ["pool"], registry=r)
        self.pool_ready = Gauge("orchard_pool_ready", "Pool sandboxes ready to be taken",
                                ["pool"], registry=r)
        self.pool_hits = Counter("orchard_pool_hits", "Creates served from the pool",
                                 ["pool"], registry=r)
        self.pool_misses = Counter("orchard_pool_misses",
                                   "Creates that matched the pool but found none ready",
                                   ["pool"], registry=r)
