"""The event log's store contract (append, filter, page, prune), on SQLite and a real Redis."""

from __future__ import annotations

import sqlite3
import time
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis

from orchard.env.schema import EventKind, SandboxEvent
from orchard.env.state import StateStore, sqlite_path
from tests.conftest import MakeStore  # store fixtures: SQLite and a real Redis

T0 = 1_700_000_000.0


def event(sid: str, session: str | None, t: float = T0, kind: EventKind = EventKind.exec,
          **data: object) -> SandboxEvent:
    return SandboxEvent(sandbox_id=sid, time=t, kind=kind, session=session,
                        labels={"run": session or "none"}, data=data)


async def test_append_assigns_increasing_seqs_that_stored_events_carry(
        store: StateStore) -> None:
    sent = [event("a", "r1", cmd=i) for i in range(3)] + [event("b", None, cmd=9)]
    appended = [await store.append_event(e) for e in sent]
    seqs = [e.seq for e in appended]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4 and seqs[0] > 0
    # Apart from the seq, what comes back is what went in.
    assert [e.model_copy(update={"seq": 0}) for e in appended] == sent
    assert await store.events() == appended


async def test_bodies_survive_byte_for_byte(store: StateStore) -> None:
    data = {"command": "printf 'é\\n\"q\"' | tee /tmp/x", "env": {"A": "1", "Ü": "ß"},
            "stdin": {"size": 3, "sha256": "ab" * 32, "content_b64": "YWJj"},
            "argv": None, "exit_code": -9, "nested": [{"x": [1, 2.5, None, True]}]}
    sent = event("a", "r1", kind=EventKind.file_write, **data)
    assert (await store.append_event(sent)).data == data
    (stored,) = await store.events(sandbox_id="a")
    assert stored.data == data and stored.labels == {"run": "r1"}
    assert stored.kind == EventKind.file_write and stored.time == T0


async def test_seqs_keep_increasing_across_store_instances(make_store: MakeStore) -> None:
    first, second = make_store(), make_store()
    a = await first.append_event(event("a", "r1"))
    b = await second.append_event(event("b", "r1"))
    c = await first.append_event(event("a", "r1"))
    assert a.seq < b.seq < c.seq
    assert [e.seq for e in await second.events(session="r1")] == [a.seq, b.seq, c.seq]


async def test_filters_by_sandbox_session_and_both(store: StateStore) -> None:
    ids = {}
    for sid, session in [("a", "r1"), ("b", "r1"), ("c", "r2"), ("a", "r1"), ("d", None),
                         ("c", "r2")]:
        ids.setdefault((sid, session), []).append((await store.append_event(
            event(sid, session))).seq)
    assert [e.seq for e in await store.events(sandbox_id="a")] == ids[("a", "r1")]
    assert [e.seq for e in await store.events(session="r1")] == sorted(
        ids[("a", "r1")] + ids[("b", "r1")])
    assert [e.seq for e in await store.events(sandbox_id="c", session="r2")] == ids[("c", "r2")]
    assert await store.events(sandbox_id="a", session="r2") == []
    assert await store.events(session="nope") == []
    assert [e.seq for e in await store.events(sandbox_id="d")] == ids[("d", None)]
    assert len(await store.events()) == 6


async def test_after_and_limit_page_through_everything(store: StateStore) -> None:
    seqs = [(await store.append_event(event("a", "r1", cmd=i))).seq for i in range(7)]
    pages, after = [], 0
    while page := await store.events(session="r1", after=after, limit=3):
        assert len(page) <= 3
        pages.append([e.seq for e in page])
        after = page[-1].seq
    assert pages == [seqs[:3], seqs[3:6], seqs[6:]]
    assert await store.events(after=seqs[-1]) == []
    assert [e.seq for e in await store.events(sandbox_id="a", after=seqs[4])] == seqs[5:]


async def test_limit_counts_matches_when_one_index_is_filtered_by_the_other(
        store: StateStore) -> None:
    # Redis narrows by the sandbox index and checks the session on the bodies: a page of the
    # index that holds few matches must not end the listing early.
    seqs = {"s1": [], "s2": []}
    for i in range(9):
        session = "s1" if i % 3 == 0 else "s2"
        seqs[session].append((await store.append_event(event("x", session))).seq)
    got = await store.events(sandbox_id="x", session="s1", limit=2)
    assert [e.seq for e in got] == seqs["s1"][:2]
    got = await store.events(sandbox_id="x", session="s1", after=got[-1].seq, limit=2)
    assert [e.seq for e in got] == seqs["s1"][2:]


async def test_prune_drops_old_events_and_their_index_entries(store: StateStore,
                                                             store_url: str) -> None:
    old = [await store.append_event(event("gone", "old-run", T0 - 100)),
           await store.append_event(event("gone", "old-run", T0 - 90)),
           await store.append_event(event("mixed", "run", T0 - 80)),
           await store.append_event(event("nosession", None, T0 - 70))]
    new = [await store.append_event(event("mixed", "run", T0)),
           await store.append_event(event("fresh", "run", T0 + 5)),
           await store.append_event(event("edge", "edge", T0 - 50))]  # exactly at the cutoff
    assert await store.prune_events(T0 - 50) == len(old)
    assert await store.events() == new
    assert await store.events(sandbox_id="gone") == []
    assert await store.events(session="old-run") == []
    assert await store.events(sandbox_id="nosession") == []
    assert [e.seq for e in await store.events(sandbox_id="mixed")] == [new[0].seq]
    assert await store.prune_events(T0 - 50) == 0
    # Appending goes on after the pruned seqs (none is handed out twice).
    later = await store.append_event(event("fresh", "run"))
    assert later.seq > new[-1].seq

    remaining = {e.seq for e in new} | {later.seq}
    if store_url.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(store_url)) as db:
            rows = {r[0] for r in db.execute("SELECT seq FROM events")}
        assert rows == remaining
        return
    prefix = parse_qs(urlsplit(store_url).query)["prefix"][0]
    admin = aioredis.from_url(store_url.split("?")[0], decode_responses=True)
    try:
        keys = {k async for k in admin.scan_iter(f"{prefix}:events*")}
        # No index of a sandbox or session whose events are all gone is left behind.
        assert keys == {f"{prefix}:events", f"{prefix}:events:seq", f"{prefix}:events:time",
                        f"{prefix}:events:order", f"{prefix}:events:sb:mixed",
                        f"{prefix}:events:sb:fresh", f"{prefix}:events:sb:edge",
                        f"{prefix}:events:ses:run", f"{prefix}:events:ses:edge"}
        assert int(await admin.get(f"{prefix}:events:seq")) == later.seq
        expect = {str(s) for s in remaining}
        assert set(await admin.hkeys(f"{prefix}:events")) == expect
        assert set(await admin.zrange(f"{prefix}:events:time", 0, -1)) == expect
        assert set(await admin.zrange(f"{prefix}:events:order", 0, -1)) == expect
        assert await admin.zrange(f"{prefix}:events:sb:mixed", 0, -1) == [str(new[0].seq)]
        assert set(await admin.zrange(f"{prefix}:events:ses:run", 0, -1)) == {
            str(new[0].seq), str(new[1].seq), str(later.seq)}
    finally:
        await admin.aclose()


async def test_prune_by_time_not_by_seq(store: StateStore) -> None:
    # Events are appended when an action ends but stamped when it began: a long exec's event
    # comes after newer ones in seq, and ages by its own time.
    short = await store.append_event(event("a", "r", time.time()))
    long = await store.append_event(event("a", "r", time.time() - 3600))
    assert long.seq > short.seq
    assert await store.prune_events(time.time() - 60) == 1
    assert await store.events() == [short]
