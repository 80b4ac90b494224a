"""Redis state: what lets several orchestrator replicas share sandboxes, jobs and locks.

``store.py`` holds the records and the event log, ``lock.py`` the locks, ``pubsub.py`` the
wake-ups. Every key lives under a prefix (``?prefix=NAME`` in the URL, default ``orchard``),
so several deployments, or several tests, can share one server. Layout under prefix P:

    P:sandboxes            hash  sandbox_id -> SandboxInfo JSON
    P:sandboxes:updated    zset  sandbox_id scored by last write (listing order)
    P:sandboxes:deleted    zset  deleted sandboxes scored by last write (what prune may drop)
    P:jobs                 hash  job_id -> Job JSON
    P:jobs:unfinished      set   queued or running job ids
    P:jobs:finished        zset  finished job ids scored by last write (what prune may drop)
    P:replicas             zset  replica scored by expiry, in the server's clock
    P:lock:NAME            str   owner of lock NAME, with a PX expiry
    P:fence:NAME           int   last fencing token handed out for lock NAME
    P:ch:CHANNEL           pub/sub channel behind publish/subscribe
    P:unlocked:NAME        pub/sub channel announcing that lock NAME was released
    P:events               hash  seq -> SandboxEvent JSON
    P:events:seq           int   last seq handed out
    P:events:time          zset  seq scored by event time (what prune_events may drop)
    P:events:order         zset  seq scored by seq (all events, in order)
    P:events:sb:ID         zset  seq scored by seq, one sandbox's events
    P:events:ses:SESSION   zset  seq scored by seq, one session's events
"""

from orchard.env.state.redis.store import RedisStore

__all__ = ["RedisStore"]
