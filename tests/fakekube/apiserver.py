"""An in-process fake Kubernetes API server for tests and benchmarks.

It speaks the real REST protocol over real HTTP on 127.0.0.1, so `kubernetes_asyncio` and
`kubectl` talk to it unmodified. It keeps objects in memory and runs no controllers: a
Deployment never gets pods, a Pod never gets scheduled (a fake kubelet does that, see below).

Usage::

    with FakeApiServer(token="secret") as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        api = await kubernetes_asyncio.config.new_client_from_config(str(kubeconfig))

or in its own process: ``python -m tests.fakekube.apiserver --port P --kubeconfig PATH``
(prints the URL once ready, serves until SIGTERM/SIGINT).

Served: core v1 namespaces, pods, configmaps, secrets, services, serviceaccounts, events;
apps/v1 deployments, statefulsets; networking.k8s.io/v1 networkpolicies; policy/v1
poddisruptionbudgets; rbac.authorization.k8s.io/v1 roles, rolebindings, clusterroles,
clusterrolebindings; legacy discovery (kubectl falls back to it from aggregated discovery).

Behaviour worth knowing, mostly as in a real cluster:
- Namespaced objects need their Namespace to exist (default, kube-system, kube-public and
  kube-node-lease are pre-created); deleting a Namespace deletes everything in it at once.
- Deletion is immediate: no graceful termination, finalizers or garbage collection.
- Kinds with a status subresource (pods, services, namespaces, deployments, statefulsets,
  poddisruptionbudgets) have status reset on create (a Pod starts as ``phase: Pending``),
  status changes ignored by the main endpoint, and only status taken from ``.../status``.
- An update that changes nothing writes nothing (no new resourceVersion, no event).
- Strategic merge patches are applied as JSON merge patches ($-directives dropped), so list
  fields are replaced wholesale; server-side apply is refused with 415.
- ``limit``/``continue`` are ignored: lists are always complete; ``dryRun`` writes persist nothing.
- No OpenAPI documents (404), so ``kubectl apply`` needs ``--validate=false``.
- kubectl never sends credentials over plain http, so point kubectl only at a server
  constructed without ``token`` (kubernetes_asyncio does send the token).

Constructor: ``FakeApiServer(*, port=0, token=None, history_limit=100_000,
bookmark_interval=5.0, namespaces=DEFAULT_NAMESPACES)``: ``history_limit`` events are kept
for watches to resume from; with ``allowWatchBookmarks`` an idle watch gets a BOOKMARK every
``bookmark_interval`` seconds. ``url``, ``port``, ``start()``, ``stop()``, context manager,
``write_kubeconfig(path, namespace="default") -> Path``.

Test controls (thread-safe, callable from any thread):
- ``requests``: a `RequestLog` of every HTTP request; ``count(...)``, ``reset_counts()``.
- ``inject_fault(status, method=, resource=, times=, retry_after=, watch=)``.
- ``compact()``: forget watch history, so resuming an older watch gets 410 Expired.
- ``disconnect_watches()``: abort every open watch connection mid-stream.
- ``prune_fields(resource, *paths)``: drop these dotted fields (``"spec.hostUsers"``) from
  every object of that resource written from now on, without a word, as an API server drops
  a field it does not know or whose feature gate is off; no paths: stop.

In-process API for a fake kubelet (not logged in ``requests``). The coroutines must run on
the server's own loop, e.g. from a listener or via ``run_in_loop``; objects returned or passed
to listeners are copies. ``resource`` is a plural such as "pods"; ``namespace`` is None for
cluster-scoped kinds. Failures raise `ApiError` (``.code``/``.reason``, e.g. 404 NotFound
when the object is gone).
- ``async get_object(resource, namespace, name) -> dict | None``
- ``async list_objects(resource, namespace=None, label_selector=None) -> list[dict]``
- ``async create_object(resource, namespace, obj) -> dict``
- ``async update_status(resource, namespace, name, status) -> dict``: JSON-merge ``status``
  into the object's ``.status``; bumps resourceVersion and emits MODIFIED if anything changed.
- ``async delete_object(resource, namespace, name) -> dict``
- ``add_listener(callback)`` / ``remove_listener(callback)``: ``callback(event_type, obj)`` is
  called synchronously on the server loop after every write of every resource, HTTP or
  in-process, with event_type ADDED, MODIFIED or DELETED. It must not block (schedule work
  with ``asyncio.get_running_loop().create_task(...)``); its exceptions are logged. Tasks
  still running on the server loop are cancelled by ``stop()``.
- ``run_in_loop(coro) -> concurrent.futures.Future``: run a coroutine on the server loop.
- ``loop``: the server's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import copy
import json
import logging
import math
import os
import random
import re
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Listener = Callable[[str, Obj], None]
T = TypeVar("T")

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# A real API server ends watches after 30-60 minutes when the client sets no timeout.
DEFAULT_WATCH_TIMEOUT = 1800.0
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
            405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
            422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}


@dataclass(frozen=True)
class ResourceKind:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    has_status: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS = (
    ResourceKind("", "v1", "namespaces", "Namespace", False, ("ns",), has_status=True),
    ResourceKind("", "v1", "pods", "Pod", True, ("po",), has_status=True),
    ResourceKind("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    ResourceKind("", "v1", "secrets", "Secret", True),
    ResourceKind("", "v1", "services", "Service", True, ("svc",), has_status=True),
    ResourceKind("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    ResourceKind("", "v1", "events", "Event", True, ("ev",)),
    ResourceKind("apps", "v1", "deployments", "Deployment", True, ("deploy",), has_status=True),
    ResourceKind("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), has_status=True),
    ResourceKind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True,
                 ("netpol",)),
    ResourceKind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",),
                 has_status=True),
    ResourceKind("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ResourceKind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ResourceKind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ResourceKind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                 False),
)
_BY_PLURAL = {k.plural: k for k in KINDS}
_IN_ALL = {"pods", "services", "deployments", "statefulsets"}  # what `kubectl get all` shows
_BY_PATH = {(k.group, k.version, k.plural): k for k in KINDS}


class ApiError(Exception):
    """A Kubernetes API failure, rendered to clients as a `Status` object."""

    def __init__(self, code: int, message: str, *, reason: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or _REASONS.get(code) or HTTPStatus(code).phrase.replace(" ", "")
        self.retry_after = retry_after

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": str(self), "reason": self.reason, "code": self.code}
        if self.retry_after is not None:
            body["details"] = {"retryAfterSeconds": math.ceil(self.retry_after)}
        return body


# --- selectors -------------------------------------------------------------------------------

_LABEL_REQ = re.compile(
    r"\s*(?:!\s*(?P<absent>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*")
_FIELD_REQ = re.compile(r"\s*(?P<path>[\w.]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^,]*?)\s*")


class Selector:
    """A parsed labelSelector and fieldSelector, matched against whole objects."""

    def __init__(self, labels: str | None = None, fields: str | None = None) -> None:
        self._labels: list[tuple[str, str, frozenset[str]]] = []
        self._fields: list[tuple[list[str], bool, str]] = []
        # Commas inside "in (a,b)" do not separate requirements.
        for part in re.split(r",(?![^()]*\))", labels or ""):
            if not part.strip():
                continue
            m = _LABEL_REQ.fullmatch(part)
            if m is None:
                raise ApiError(400, f"unable to parse requirement: {part.strip()!r}")
            if m["absent"]:
                self._labels.append((m["absent"], "!", frozenset()))
            elif m["setop"]:
                values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
                self._labels.append((m["key"], m["setop"], values))
            elif m["op"]:  # "a=b" is "a in (b)", "a!=b" is "a notin (b)"
                self._labels.append((m["key"], "notin" if m["op"] == "!=" else "in",
                                     frozenset([m["value"]])))
            else:
                self._labels.append((m["key"], "exists", frozenset()))
        for part in (fields or "").split(","):
            if not part.strip():
                continue
            m = _FIELD_REQ.fullmatch(part)
            if m is None:
                raise ApiError(400, f"invalid field selector: {part.strip()!r}")
            self._fields.append((m["path"].split("."), m["op"] != "!=", m["value"]))

    def matches(self, obj: Obj) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        for key, op, values in self._labels:
            value = labels.get(key)  # None, which no set holds, when the label is absent
            ok = {"in": value in values, "notin": value not in values,
                  "exists": key in labels, "!": key not in labels}[op]
            if not ok:
                return False
        for path, equal, value in self._fields:
            node: Any = obj
            for step in path:
                node = node.get(step) if isinstance(node, dict) else None
            if isinstance(node, bool):  # field selectors spell booleans the JSON way
                node = str(node).lower()
            actual = "" if node is None else str(node)
            if (actual == value) != equal:
                return False
        return True


# --- patches ---------------------------------------------------------------------------------

def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value and leaves `target` untouched."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _drop_directives(patch: Any) -> Any:
    """Strategic-merge "$patch"/"$setElementOrder/..." keys mean nothing to a merge patch."""
    if isinstance(patch, dict):
        return {k: _drop_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [_drop_directives(v) for v in patch]
    return patch


def _json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) applied to a copy of doc."""
    if not isinstance(ops, list):
        raise ApiError(400, "a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)

    def split(pointer: str) -> tuple[Any, str]:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
        if not tokens:
            raise ApiError(422, "JSON patch operations on the whole document are not supported")
        parent = doc
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        return parent, tokens[-1]

    def get(pointer: str) -> Any:
        parent, key = split(pointer)
        return parent[int(key)] if isinstance(parent, list) else parent[key]

    def put(pointer: str, value: Any, insert: bool) -> None:
        parent, key = split(pointer)
        if not isinstance(parent, list):
            if not insert and key not in parent:
                raise KeyError(key)
            parent[key] = value
        elif key == "-" and insert:
            parent.append(value)
        elif insert:
            parent.insert(int(key), value)
        else:
            parent[int(key)] = value

    def remove(pointer: str) -> Any:
        parent, key = split(pointer)
        return parent.pop(int(key) if isinstance(parent, list) else key)

    for op in ops:
        try:
            kind, path = op["op"], op["path"]
            if kind == "add":
                put(path, copy.deepcopy(op["value"]), insert=True)
            elif kind == "replace":
                put(path, copy.deepcopy(op["value"]), insert=False)
            elif kind == "remove":
                remove(path)
            elif kind == "move":
                put(path, remove(op["from"]), insert=True)
            elif kind == "copy":
                put(path, copy.deepcopy(get(op["from"])), insert=True)
            elif kind == "test":
                if get(path) != op["value"]:
                    raise ApiError(422, f"JSON patch test failed at {path}")
            else:
                raise ApiError(400, f"unknown JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
            raise ApiError(422, f"cannot apply JSON patch operation {op!r}: {e!r}") from e
    return doc


def _strip_directives_and_merge(doc: Any, patch: Any) -> Any:
    return _merge_patch(doc, _drop_directives(patch))


_PATCHERS: dict[str, Callable[[Any, Any], Any]] = {
    "application/merge-patch+json": _merge_patch,
    "application/strategic-merge-patch+json": _strip_directives_and_merge,
    "application/json-patch+json": _json_patch,
}


# --- request log and faults ------------------------------------------------------------------

@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request; the resource fields are None for discovery and unknown paths."""

    method: str
    path: str
    query: dict[str, str]
    time: float  # time.monotonic()
    resource: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    verb: str | None = None  # Kubernetes verb: get, list, watch, create, update, patch, ...
    watch: bool = False


class RequestLog:
    """Thread-safe log of every HTTP request the server received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def append(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def count(self, method: str | None = None, resource: str | None = None,
              name: str | None = None, watch: bool | None = None,
              verbs: str | Iterable[str] | None = None) -> int:
        """Requests matching every given filter; `verbs` is one Kubernetes verb or several."""
        wanted = {verbs} if isinstance(verbs, str) else set(verbs) if verbs is not None else None
        return sum(1 for r in self.snapshot()
                   if (method is None or r.method == method.upper())
                   and (resource is None or r.resource == resource)
                   and (name is None or r.name == name)
                   and (watch is None or r.watch == watch)
                   and (wanted is None or r.verb in wanted))

    def reset_counts(self) -> None:
        with self._lock:
            self._records.clear()


@dataclass
class _Fault:
    status: int
    method: str | None
    resource: str | None
    watch: bool | None
    retry_after: float | None
    remaining: int

    def matches(self, r: RequestRecord) -> bool:
        return ((self.method is None or self.method == r.method)
                and (self.resource is None or self.resource == r.resource)
                and (self.watch is None or self.watch == r.watch))


# --- watches ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Event:
    rv: int
    plural: str
    type: str
    obj: Obj
    old: Obj | None  # the object before a MODIFIED or DELETED


class _Watcher:
    def __init__(self, kind: ResourceKind, namespace: str | None, selector: Selector,
                 request: web.Request) -> None:
        self.kind, self.namespace, self.selector, self.request = kind, namespace, selector, request
        # None wakes the stream up to end it.
        self.queue: asyncio.Queue[tuple[str, Obj] | None] = asyncio.Queue()

    def wants(self, obj: Obj) -> bool:
        return ((self.namespace is None or obj["metadata"].get("namespace") == self.namespace)
                and self.selector.matches(obj))

    def offer(self, ev: _Event) -> None:
        now = ev.type != "DELETED" and self.wants(ev.obj)
        before = ev.old is not None and self.wants(ev.old)
        if now:
            self.queue.put_nowait(("MODIFIED" if before else "ADDED", ev.obj))
        elif before and ev.old is not None:
            # Like a real server: an object that stops matching is DELETED for this watch,
            # shown as it last matched but at the version of the change.
            gone = ev.obj if ev.type == "DELETED" else {
                **ev.old, "metadata": {**ev.old["metadata"], "resourceVersion": str(ev.rv)}}
            self.queue.put_nowait(("DELETED", gone))


@dataclass(frozen=True)
class _Route:
    plural: str
    kind: ResourceKind | None  # None: not served here
    namespace: str | None
    name: str | None
    subresource: str | None
    verb: str | None
    watch: bool


def _parse_route(method: str, path: str, query: dict[str, str]) -> _Route | None:
    """The resource a request addresses; None for discovery and other non-resource paths."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    # /api/v1/namespaces/NAME[/status] is the namespace itself, not a scope.
    if len(rest) >= 3 and rest[0] == "namespaces" and (group, version, rest[2]) in _BY_PATH:
        namespace, rest = rest[1], rest[2:]
    kind = _BY_PATH.get((group, version, rest[0]))
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if kind is not None and (len(rest) > 3 or (namespace is not None and not kind.namespaced)
                             or (sub is not None and (sub != "status" or not kind.has_status))):
        kind = None
    watch = (method == "GET" and name is None
             and query.get("watch", "").lower() in ("true", "1"))
    verb = {"GET": "get" if name else "watch" if watch else "list",
            "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection"}.get(method)
    return _Route(rest[0], kind, namespace, name, sub, verb, watch)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_response(body: Any, status: int = 200,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type="application/json", headers=headers)


def _spec_of(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


def _without_rv(obj: Obj) -> Obj:
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


# --- the server ------------------------------------------------------------------------------

class FakeApiServer:
    """A fake kube-apiserver on 127.0.0.1, served by its own event loop in a daemon thread."""

    def __init__(self, *, port: int = 0, token: str | None = None,
                 history_limit: int = 100_000, bookmark_interval: float = 5.0,
                 namespaces: Iterable[str] = DEFAULT_NAMESPACES) -> None:
        self.port = port
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.requests = RequestLog()
        self._faults: list[_Fault] = []
        self._faults_lock = threading.Lock()
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {k.plural: {} for k in KINDS}
        self._rv = 0
        self._history: deque[_Event] = deque(maxlen=history_limit)
        self._history_start = 0  # watches may resume from any version >= this one
        self._watchers: dict[str, set[_Watcher]] = {k.plural: set() for k in KINDS}
        self._listeners: list[Listener] = []
        self._pruned: dict[str, tuple[str, ...]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        for ns in namespaces:
            self._create(_BY_PLURAL["namespaces"], None, {"metadata": {"name": ns}})

    # lifecycle

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the fake API server has no port until start()")
        return f"http://127.0.0.1:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the fake API server is not running; call start() first")
        return self._loop

    def start(self) -> FakeApiServer:
        if self._thread is not None:
            raise RuntimeError("the fake API server is already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", self.port))
        except OSError as e:
            sock.close()
            raise RuntimeError(f"fake API server cannot bind 127.0.0.1:{self.port}: {e}") from e
        self.port = sock.getsockname()[1]
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="fake-kube-apiserver",
                                        daemon=True)
        self._thread.start()
        try:
            self.run_in_loop(self._listen(sock)).result()
        except BaseException:
            self.stop()
            raise
        return self

    async def _listen(self, sock: socket.socket) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation ends a watch's handler as soon as its client goes away.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     handler_cancellation=True, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, backlog=1024).start()

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        loop, thread = self._loop, self._thread
        self.run_in_loop(self._shutdown()).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._thread = self._runner = None

    async def _shutdown(self) -> None:
        for watchers in self._watchers.values():
            for w in watchers:
                w.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()
        # Work that listeners (a fake kubelet) left running would die noisily with the loop.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_default_executor()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str = "default") -> Path:
        """Write a kubeconfig for this server (written atomically: pollers never see half)."""
        path = Path(path)
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token or "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": namespace}}],
            "current-context": "fake",
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        os.replace(tmp, path)
        return path

    # test controls

    def count(self, method: str | None = None, resource: str | None = None,
              name: str | None = None, watch: bool | None = None,
              verbs: str | Iterable[str] | None = None) -> int:
        return self.requests.count(method, resource, name, watch, verbs)

    def reset_counts(self) -> None:
        self.requests.reset_counts()

    def inject_fault(self, status: int, *, method: str | None = None,
                     resource: str | None = None, times: int = 1,
                     retry_after: float | None = None, watch: bool | None = None) -> None:
        """Fail the next `times` requests matching every given filter with `status`."""
        if status < 400 or status not in list(HTTPStatus):
            raise ValueError(f"inject_fault needs an HTTP error status, not {status!r}")
        fault = _Fault(status, method.upper() if method else None, resource, watch,
                       retry_after, times)
        with self._faults_lock:
            self._faults.append(fault)

    def prune_fields(self, resource: str, *paths: str) -> None:
        """Drop ``paths`` (dotted, e.g. "spec.hostUsers") from every ``resource`` object
        written from now on, silently; no paths: keep every field again."""
        kind = _BY_PLURAL[resource]

        def prune() -> None:
            self._pruned[kind.plural] = paths
        self._on_loop(prune)

    def compact(self) -> None:
        """Forget all watch history: watches from any version older than now get 410."""
        def compact() -> None:
            self._history.clear()
            self._history_start = self._rv
        self._on_loop(compact)

    def disconnect_watches(self) -> None:
        """Abort every open watch connection abruptly, with no clean end of the stream."""
        def disconnect() -> None:
            for watchers in self._watchers.values():
                for w in watchers:
                    if w.request.transport is not None:
                        w.request.transport.abort()
        self._on_loop(disconnect)

    def run_in_loop(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        if self._loop is None or threading.current_thread() is self._thread:
            fn()
            return

        async def call() -> None:
            fn()
        self.run_in_loop(call()).result()

    # in-process API (server loop only)

    def _kind_for(self, resource: str) -> ResourceKind:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is None or running is not self._loop:
            raise RuntimeError("FakeApiServer's in-process API must run on the server loop; "
                               "use server.run_in_loop(...)")
        if resource not in _BY_PLURAL:
            raise ValueError(f"unknown resource {resource!r}; served: {sorted(_BY_PLURAL)}")
        return _BY_PLURAL[resource]

    async def get_object(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        obj = self._objects[self._kind_for(resource).plural].get((namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    async def list_objects(self, resource: str, namespace: str | None = None,
                           label_selector: str | None = None) -> list[Obj]:
        kind = self._kind_for(resource)
        return copy.deepcopy(self._list(kind, namespace, Selector(label_selector)))

    async def create_object(self, resource: str, namespace: str | None, obj: Obj) -> Obj:
        return copy.deepcopy(self._create(self._kind_for(resource), namespace,
                                          copy.deepcopy(obj)))

    async def update_status(self, resource: str, namespace: str | None, name: str,
                            status: Obj) -> Obj:
        kind = self._kind_for(resource)
        old = self._get(kind, namespace, name)
        body = {**old, "status": _merge_patch(old.get("status") or {}, status)}
        return copy.deepcopy(self._update(kind, namespace, name, body, status_only=True))

    async def delete_object(self, resource: str, namespace: str | None, name: str) -> Obj:
        return copy.deepcopy(self._delete(self._kind_for(resource), namespace, name, {}))

    def add_listener(self, callback: Listener) -> None:
        self._listeners.append(callback)

    def remove_listener(self, callback: Listener) -> None:
        self._listeners.remove(callback)

    # the store; all of it runs on the server loop, so writes need no locks

    def _bucket(self, kind: ResourceKind) -> dict[tuple[str, str], Obj]:
        return self._objects[kind.plural]

    def _get(self, kind: ResourceKind, namespace: str | None, name: str) -> Obj:
        obj = self._bucket(kind).get((namespace or "", name))
        if obj is None:
            raise ApiError(404, f'{kind.plural} "{name}" not found')
        return obj

    def _list(self, kind: ResourceKind, namespace: str | None, selector: Selector) -> list[Obj]:
        return [obj for (ns, _), obj in sorted(self._bucket(kind).items())
                if (namespace is None or ns == namespace) and selector.matches(obj)]

    def _commit(self, kind: ResourceKind, event_type: str, obj: Obj, old: Obj | None,
                dry_run: bool = False) -> Obj:
        """Store a freshly built object (never mutated afterwards) and announce it."""
        if dry_run:
            return obj
        self._rv += 1
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(self._rv)}
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if event_type == "DELETED":
            del self._bucket(kind)[key]
        else:
            self._bucket(kind)[key] = obj
        if len(self._history) == self._history.maxlen:
            self._history_start = self._history[0].rv
        event = _Event(self._rv, kind.plural, event_type, obj, old)
        self._history.append(event)
        for watcher in self._watchers[kind.plural]:
            watcher.offer(event)
        for listener in list(self._listeners):
            try:
                listener(event_type, copy.deepcopy(obj))
            except Exception:
                log.exception("fake API server listener %r failed", listener)
        return obj

    def _check_body(self, kind: ResourceKind, body: Any) -> Obj:
        if not isinstance(body, dict) or not isinstance(body.get("metadata") or {}, dict):
            raise ApiError(400, f"expected a {kind.kind} object with object metadata")
        for field, want in (("kind", kind.kind), ("apiVersion", kind.api_version)):
            if body.get(field, want) != want:
                raise ApiError(400, f"{field} {body[field]!r} does not match the URL: "
                                    f"expected {want!r}")
        obj = {**body, "kind": kind.kind, "apiVersion": kind.api_version,
               "metadata": dict(body.get("metadata") or {})}
        for path in self._pruned.get(kind.plural, ()):
            *parents, name = path.split(".")
            parent = obj
            for part in parents:  # copied on the way down: the body may share stored dicts
                child = parent.get(part)
                if not isinstance(child, dict):
                    break
                child = parent[part] = dict(child)
                parent = child
            else:
                parent.pop(name, None)
        return obj

    def _check_namespace(self, kind: ResourceKind, meta: Obj, namespace: str | None) -> None:
        if not kind.namespaced:
            meta.pop("namespace", None)
            return
        meta["namespace"] = meta.get("namespace") or namespace
        if meta["namespace"] != namespace:
            raise ApiError(400, "the namespace of the provided object does not match the "
                                f"namespace sent on the request ({meta['namespace']!r} vs "
                                f"{namespace!r})")

    def _create(self, kind: ResourceKind, namespace: str | None, body: Any,
                dry_run: bool = False) -> Obj:
        obj = self._check_body(kind, body)
        meta = obj["metadata"]
        if kind.namespaced and namespace is None:
            raise ApiError(404, f"{kind.plural} must be created in a namespace")
        self._check_namespace(kind, meta, namespace)
        if kind.namespaced and ("", namespace) not in self._objects["namespaces"]:
            raise ApiError(404, f'namespaces "{namespace}" not found')
        if meta.get("resourceVersion"):
            # What etcd storage answers in a real cluster, 500 included.
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise ApiError(422, f"{kind.kind} is invalid: metadata.name: Required value: "
                                    "name or generateName is required")
            # Real servers also retry generated names that happen to collide.
            for _ in range(16):
                meta["name"] = prefix + "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
                if (namespace or "", meta["name"]) not in self._bucket(kind):
                    break
        name = meta["name"]
        if not isinstance(name, str) or len(name) > 253 or not _NAME_RE.fullmatch(name):
            raise ApiError(422, f'{kind.kind} "{name}" is invalid: metadata.name: must be a '
                                "lowercase RFC 1123 subdomain")
        if (meta.get("namespace", ""), name) in self._bucket(kind):
            raise ApiError(409, f'{kind.plural} "{name}" already exists', reason="AlreadyExists")
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        if kind.kind == "Pod":
            obj["status"] = {"phase": "Pending"}
        elif kind.has_status:
            obj["status"] = {}
        return self._commit(kind, "ADDED", obj, None, dry_run)

    def _update(self, kind: ResourceKind, namespace: str | None, name: str, body: Any, *,
                status_only: bool, dry_run: bool = False) -> Obj:
        obj = self._check_body(kind, body)
        meta = obj["metadata"]
        if meta.get("name", name) != name:
            raise ApiError(400, f"the name of the object ({meta['name']}) does not match the "
                                f"name on the URL ({name})")
        self._check_namespace(kind, meta, namespace)
        old = self._get(kind, namespace, name)
        old_meta = old["metadata"]
        if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise ApiError(409, f'Operation cannot be fulfilled on {kind.plural} "{name}": the '
                                "object has been modified; please apply your changes to the "
                                "latest version and try again")
        if status_only:
            new = {**old, "status": obj.get("status") or {}}
        else:
            new = obj
            new.pop("status", None)
            if "status" in old:
                new["status"] = old["status"]
            generation = old_meta.get("generation", 1)
            if _spec_of(new) != _spec_of(old):
                generation += 1
            meta.update(name=name, uid=old_meta["uid"], generation=generation,
                        creationTimestamp=old_meta["creationTimestamp"],
                        resourceVersion=old_meta["resourceVersion"])
        if _without_rv(new) == _without_rv(old):
            return old
        return self._commit(kind, "MODIFIED", new, old, dry_run)

    def _patch(self, kind: ResourceKind, namespace: str | None, name: str, content_type: str,
               patch: Any, *, status_only: bool, dry_run: bool) -> Obj:
        if content_type == "application/apply-patch+yaml":
            raise ApiError(415, "server-side apply is not supported by the fake API server")
        patcher = _PATCHERS.get(content_type)
        if patcher is None:
            raise ApiError(415, f"unsupported patch content type {content_type!r}; use one of "
                                f"{sorted(_PATCHERS)}")
        if content_type != "application/json-patch+json" and not isinstance(patch, dict):
            raise ApiError(400, "a merge patch must be a JSON object")
        patched = patcher(self._get(kind, namespace, name), patch)
        return self._update(kind, namespace, name, patched, status_only=status_only,
                            dry_run=dry_run)

    def _delete(self, kind: ResourceKind, namespace: str | None, name: str, options: Obj,
                dry_run: bool = False) -> Obj:
        old = self._get(kind, namespace, name)
        for field, value in (options.get("preconditions") or {}).items():
            if value is not None and old["metadata"].get(field) != value:
                raise ApiError(409, f"Precondition failed: {field} in precondition: {value}, "
                                    f"{field} in object meta: {old['metadata'].get(field)}")
        if kind.plural == "namespaces" and not dry_run:
            for other in KINDS:
                if other.namespaced:
                    for obj in self._list(other, name, Selector()):
                        self._delete(other, name, obj["metadata"]["name"], {})
        return self._commit(kind, "DELETED", {**old}, old, dry_run)

    # HTTP

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        route = _parse_route(request.method, request.path, query)
        r = route
        record = RequestRecord(request.method, request.path, query, time.monotonic(),
                               *((r.plural, r.namespace, r.name, r.subresource, r.verb, r.watch)
                                 if r else ()))
        self.requests.append(record)
        try:
            if self.token is not None and (request.headers.get("Authorization")
                                           != f"Bearer {self.token}"):
                raise ApiError(401, "Unauthorized")
            self._take_fault(record)
            if route is None:
                return self._discovery(request.path)
            if route.kind is None:
                raise ApiError(404, "the server could not find the requested resource")
            if route.watch:
                return await self._watch(request, route.kind, route.namespace, query)
            return await self._serve_resource(request, route.kind, route, query)
        except ApiError as e:
            headers = {}
            if e.retry_after is not None:
                headers["Retry-After"] = f"{e.retry_after:g}"
            return _json_response(e.status(), e.code, headers)
        except Exception as e:
            log.exception("fake API server failed on %s %s", request.method, request.path)
            return _json_response(ApiError(500, f"fake API server bug: {e!r}").status(), 500)

    def _take_fault(self, record: RequestRecord) -> None:
        with self._faults_lock:
            fault = next((f for f in self._faults if f.matches(record)), None)
            if fault is None:
                return
            fault.remaining -= 1
            if fault.remaining <= 0:
                self._faults.remove(fault)
        raise ApiError(fault.status, f"injected fault {fault.status}",
                       retry_after=fault.retry_after)

    async def _serve_resource(self, request: web.Request, kind: ResourceKind, route: _Route,
                              query: dict[str, str]) -> web.Response:
        ns, name, verb = route.namespace, route.name, route.verb
        if kind.namespaced and ns is None and verb != "list":
            raise ApiError(404, "the server could not find the requested resource")
        if verb is None or (name is None) != (verb in ("create", "list", "deletecollection")):
            raise ApiError(405, f"{request.method} is not allowed on {request.path}")
        dry_run = "dryRun" in query
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError as e:
            raise ApiError(400, f"invalid JSON in request body: {e}") from e
        if verb in ("list", "deletecollection"):
            selector = Selector(query.get("labelSelector"), query.get("fieldSelector"))
            items = self._list(kind, ns, selector)
            if verb == "deletecollection":
                items = [self._delete(kind, ns, o["metadata"]["name"], body or {}, dry_run)
                         for o in items]
            return _json_response({"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                                   "metadata": {"resourceVersion": str(self._rv)},
                                   "items": items})
        if verb == "create":
            return _json_response(self._create(kind, ns, body, dry_run), 201)
        assert name is not None
        status_only = route.subresource == "status"
        if verb == "get":
            return _json_response(self._get(kind, ns, name))
        if verb == "update":
            return _json_response(self._update(kind, ns, name, body, status_only=status_only,
                                               dry_run=dry_run))
        if verb == "patch":
            return _json_response(self._patch(kind, ns, name, request.content_type, body,
                                              status_only=status_only, dry_run=dry_run))
        if body is not None and not isinstance(body, dict):
            raise ApiError(400, "DeleteOptions must be a JSON object")
        return _json_response(self._delete(kind, ns, name, body or {}, dry_run))

    async def _watch(self, request: web.Request, kind: ResourceKind, namespace: str | None,
                     query: dict[str, str]) -> web.StreamResponse:
        selector = Selector(query.get("labelSelector"), query.get("fieldSelector"))
        try:
            since = int(query.get("resourceVersion") or 0)
            timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        except ValueError as e:
            raise ApiError(400, f"invalid resourceVersion or timeoutSeconds: {e}") from e
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        # From here to registering the watcher nothing awaits, so no event slips in between.
        watcher = _Watcher(kind, namespace, selector, request)
        if since and since < self._history_start:
            error = ApiError(410, f"too old resource version: {since} ({self._history_start})")
            await resp.write(json.dumps({"type": "ERROR", "object": error.status()}).encode()
                             + b"\n")
            return resp
        if since:
            for ev in self._history:
                if ev.rv > since and ev.plural == kind.plural:
                    watcher.offer(ev)
        else:
            for obj in sorted(self._list(kind, namespace, selector),
                              key=lambda o: int(o["metadata"]["resourceVersion"])):
                watcher.queue.put_nowait(("ADDED", obj))
        self._watchers[kind.plural].add(watcher)
        try:
            await self._stream(resp, watcher, timeout, bookmarks)
        finally:
            self._watchers[kind.plural].discard(watcher)
        return resp

    async def _stream(self, resp: web.StreamResponse, watcher: _Watcher, timeout: float,
                      bookmarks: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (remaining := deadline - loop.time()) > 0:
            wait = min(remaining, self.bookmark_interval) if bookmarks else remaining
            try:
                item = await asyncio.wait_for(watcher.queue.get(), wait)
            except TimeoutError:
                if bookmarks and deadline > loop.time():
                    # The queue is empty, so every event up to now has been sent.
                    mark = {"kind": watcher.kind.kind, "apiVersion": watcher.kind.api_version,
                            "metadata": {"resourceVersion": str(self._rv)}}
                    await resp.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode()
                                     + b"\n")
                continue
            # Send whatever is queued in one chunk; None means the server is stopping.
            lines = []
            while item is not None:
                lines.append(json.dumps({"type": item[0], "object": item[1]},
                                        separators=(",", ":")).encode())
                if watcher.queue.empty():
                    break
                item = watcher.queue.get_nowait()
            if lines:
                await resp.write(b"\n".join(lines) + b"\n")
            if item is None:
                return

    # discovery

    def _discovery(self, path: str) -> web.Response:
        path = path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return _json_response({"major": "1", "minor": "37", "gitVersion": "v1.37.0-fake",
                                   "platform": "linux/amd64"})
        groups: dict[str, list[str]] = {}
        for k in KINDS:
            if k.group and k.version not in groups.setdefault(k.group, []):
                groups[k.group].append(k.version)

        def group_doc(name: str) -> Obj:
            versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in groups[name]]
            return {"name": name, "versions": versions, "preferredVersion": versions[0]}

        if path == "/api":
            return _json_response({"kind": "APIVersions", "versions": ["v1"],
                                   "serverAddressByClientCIDRs": [
                                       {"clientCIDR": "0.0.0.0/0",
                                        "serverAddress": f"127.0.0.1:{self.port}"}]})
        if path == "/apis":
            return _json_response({"kind": "APIGroupList", "apiVersion": "v1",
                                   "groups": [group_doc(g) for g in groups]})
        parts = path.split("/")[1:]
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return _json_response({"kind": "APIGroup", "apiVersion": "v1",
                                   **group_doc(parts[1])})
        # Only /api/v1 and /apis/GROUP/VERSION are left; core api_version has no slash.
        group_version = (parts[1] if parts[0] == "api" and len(parts) == 2
                         else "/".join(parts[1:]) if parts[0] == "apis" and len(parts) == 3
                         else None)
        resources: list[Obj] = []
        for k in KINDS:
            if k.api_version == group_version:
                resources.append({"name": k.plural, "singularName": k.kind.lower(),
                                  "namespaced": k.namespaced, "kind": k.kind, "verbs": VERBS,
                                  "shortNames": list(k.short_names),
                                  "categories": ["all"] if k.plural in _IN_ALL else []})
                if k.has_status:
                    resources.append({"name": f"{k.plural}/status", "singularName": "",
                                      "namespaced": k.namespaced, "kind": k.kind,
                                      "verbs": ["get", "patch", "update"]})
        if not resources:
            raise ApiError(404, "the server could not find the requested resource")
        return _json_response({"kind": "APIResourceList", "apiVersion": "v1",
                               "groupVersion": group_version, "resources": resources})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the fake Kubernetes API server until "
                                                 "SIGTERM or SIGINT.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for it here")
    parser.add_argument("--token", help="require this bearer token")
    args = parser.parse_args(argv)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    with FakeApiServer(port=args.port, token=args.token) as server:
        if args.kubeconfig:
            server.write_kubeconfig(args.kubeconfig)
        print(server.url, flush=True)
        stopping.wait()


if __name__ == "__main__":
    main()
