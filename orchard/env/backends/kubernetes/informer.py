"""A watch-based pod cache: list once, then watch from the list's resourceVersion.

It resumes a broken watch from the last resourceVersion it saw, relists from scratch when the
server says that version is gone (410), and backs off on any other error. Waiters block on
per-pod change notifications, never on polling. While the cache cannot be trusted (before the
first list, or after a failed relist) `synced` is False and `names()` refuses to answer, so
reconciliation never acts on a stale or partial view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from orchard.env.backends.kubernetes.calls import ApiCaller, Backoff
from orchard.env.errors import OrchestratorError

log = logging.getLogger("orchard.env.kubernetes")
Pod = dict[str, Any]


class NotSynced(OrchestratorError, RuntimeError):
    """The cache is not trustworthy right now."""


class PodInformer:
    def __init__(self, core: CoreV1Api, namespace: str, label_selector: str,
                 caller: ApiCaller, watch_timeout: int) -> None:
        self._core, self._namespace, self._selector = core, namespace, label_selector
        self._call, self._watch_timeout = caller, watch_timeout
        self._pods: dict[str, Pod] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self.synced = False
        self.version = 0  # the last resourceVersion applied, to tell "not yet seen" from "gone"
        self.first_sync = asyncio.Event()
        self.relists = 0
        self.last_error: str | None = None

    # --- reading ------------------------------------------------------------------------

    def get(self, name: str) -> Pod | None:
        return self._pods.get(name)

    def names(self) -> set[str]:
        if not self.synced:
            raise NotSynced(f"the pod cache is not synced ({self.last_error or 'starting'})")
        return set(self._pods)

    async def wait_for(self, name: str, done: Callable[[Pod | None], bool],
                       timeout: float) -> Pod | None:
        """The pod (or None if absent) once done(pod) holds; TimeoutError otherwise."""
        async with asyncio.timeout(timeout):
            while True:
                pod = self._pods.get(name)
                if done(pod):
                    return pod
                event = self._changed.setdefault(name, asyncio.Event())
                await event.wait()

    def _seen(self, version: str) -> None:
        # resourceVersions are opaque by contract but etcd revisions in practice; a server
        # with other ones only loses the early "deleted before we saw it" answer.
        with contextlib.suppress(ValueError):
            self.version = max(self.version, int(version))

    # --- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        version: str | None = None
        backoff = Backoff(cap=10.0)
        while True:
            try:
                if version is None:
                    version = await self._relist()
                version = await self._watch(version)
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except ApiException as e:
                self._trouble(f"{e.status} {e.reason}")
                if e.status == 410:
                    version = None  # that history is gone: only a fresh list is consistent
                    self.relists += 1
                    continue
                await asyncio.sleep(backoff.next())
            except Exception as e:  # noqa: BLE001 - stream errors: resume where we were
                self._trouble(repr(e))
                await asyncio.sleep(backoff.next())

    def _trouble(self, what: str) -> None:
        self.synced, self.last_error = False, what
        log.warning("pod informer: %s; recovering", what)

    async def _relist(self) -> str:
        body = await self._call("list_pods", lambda: self._core.list_namespaced_pod(
            self._namespace, label_selector=self._selector, _preload_content=False))
        self._pods = {p["metadata"]["name"]: p for p in body.get("items", [])}
        self._seen(body["metadata"]["resourceVersion"])
        self.synced, self.last_error = True, None
        self.first_sync.set()
        for event in self._changed.values():
            event.set()
        self._changed.clear()
        return body["metadata"]["resourceVersion"]

    async def _watch(self, version: str) -> str:
        """Apply events until the server ends the watch; return the version to resume from."""
        stream = watch.Watch(return_type="object")
        try:
            async for event in stream.stream(
                self._core.list_namespaced_pod, self._namespace,
                label_selector=self._selector, resource_version=version,
                timeout_seconds=self._watch_timeout, allow_watch_bookmarks=True,
                _request_timeout=self._watch_timeout + 30,
            ):
                self.synced, self.last_error = True, None
                pod, kind = event["raw_object"], event["type"]
                version = pod["metadata"]["resourceVersion"]
                self._seen(version)
                if kind == "BOOKMARK":
                    continue
                name = pod["metadata"]["name"]
                if kind == "DELETED":
                    self._pods.pop(name, None)
                else:
                    self._pods[name] = pod
                changed = self._changed.pop(name, None)
                if changed is not None:
                    changed.set()
        except aiohttp.ClientPayloadError as e:  # cut mid-stream: resume from what we saw
            self._trouble(repr(e))
        finally:
            await stream.close()
        return version
