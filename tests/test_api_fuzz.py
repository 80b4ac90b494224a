"""The HTTP API under fuzzing (schemathesis) and hand-written malformed requests.

Everything runs against a dedicated orchestrator with small body limits, so fuzzed creates and
deletes never touch the session's sandboxes, and the 413 paths are cheap to reach.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import create_ready, dedicated_orchestrator, needs_root, run, short_data_dir

pytestmark = needs_root

JSON_LIMIT = 16 * 1024
UPLOAD_LIMIT = 256 * 1024
# Examples per operation are multiplied by this; raise it for a longer bug hunt.
SCALE = int(os.environ.get("ORCHARD_FUZZ_SCALE", "1"))


@pytest.fixture(scope="module")
def fuzz_url(orchestrator: str, data_dir: Path) -> Iterator[str]:
    # Few sandboxes: fuzzed forks ask for up to 1000 each; past this they are turned away.
    # Fuzzed image names are registry references too: only loopback ones may be pulled, so
    # no request leaves the machine (the rest are 403).
    with dedicated_orchestrator(data_dir, max_json_body=JSON_LIMIT,
                                max_upload_bytes=UPLOAD_LIMIT, max_sandboxes=24,
                                images={"allowed_registries": ["127.0.0.1"]}) as url:
        yield url


@pytest.fixture()
def http(fuzz_url: str) -> Iterator[httpx.Client]:
    """This module's tests talk to the fuzzing orchestrator (conftest's `sandbox` too)."""
    with httpx.Client(base_url=fuzz_url, timeout=60) as client:
        yield client


def assert_error(r: httpx.Response | requests.Response, status: int) -> object:
    """The status is ``status`` and the body carries a usable ``detail``; returns it."""
    assert r.status_code == status, (r.status_code, r.text)
    detail = r.json()["detail"]
    if status == 422:  # FastAPI's validation errors: a list, each item with a message
        assert isinstance(detail, list) and detail, detail
        assert all(isinstance(item["msg"], str) and item["msg"] for item in detail), detail
    else:
        assert isinstance(detail, str) and detail.strip(), detail
    return detail


# --- fuzzing ------------------------------------------------------------------------------


def _fuzz(strategy: object, examples: int, session: requests.Session,
          failures: list[str], statuses: set[int], label: str) -> None:
    # Derandomized: the same examples every run, so a pass or a failure is repeatable.
    @settings(max_examples=examples * SCALE, deadline=None, database=None, phases=[Phase.generate],
              derandomize=True,
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @given(case=strategy)
    def check(case: schemathesis.Case) -> None:
        response = case.call(session=session, timeout=30)
        statuses.add(response.status_code)
        # 503 is admission control (a fork past max_sandboxes), not a fault: it must say when
        # to come back.
        if response.status_code == 503:
            assert response.headers.get("retry-after"), response.headers
        else:
            case.validate_response(response, checks=[not_a_server_error])
        if response.status_code >= 400:
            assert_error(response, response.status_code)

    try:
        check()
    except Unsatisfiable:
        pass  # nothing invalid to generate: an operation without parameters or body
    except Exception as exc:  # noqa: BLE001 - collect them all, report at the end
        failures.append(f"{label}: {exc}")


def test_no_operation_answers_with_a_server_error(fuzz_url: str, http: httpx.Client) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_url}/openapi.json")
    # Real ids, so that fuzzed paths, bodies and queries also reach the sandbox's agent.
    sid = create_ready(http, {"image": "host", "sandbox_id": "fuzz-target"})
    fixed = {
        "sid": sid,
        "job_id": run(http, sid, command="echo job")["job_id"],
        "pid": run(http, sid, command="sleep 600", background=True)["process_id"],
        "snapshot_id": http.post(f"/sandboxes/{sid}/snapshot").json()["snapshot_id"],
        "name": "sha256:" + "0" * 64,  # an image name: none is cached here
    }
    labels: list[str] = []
    failures: list[str] = []
    statuses: dict[str, set[int]] = {}
    with requests.Session() as session:
        for result in schema.get_all_operations():
            op = result.ok()
            labels.append(op.label)
            names = re.findall(r"{(\w+)}", op.path)
            plans = [(GenerationMode.POSITIVE, {}, 12), (GenerationMode.NEGATIVE, {}, 6)]
            # Deleting the target would leave nothing to fuzz the other operations against.
            if names and op.label != "DELETE /sandboxes/{sid}":
                pinned = {n: fixed[n] for n in names}
                plans += [(GenerationMode.POSITIVE, pinned, 20),
                          (GenerationMode.NEGATIVE, pinned, 6)]
            for mode, path_parameters, examples in plans:
                strategy = op.as_strategy(generation_mode=mode, path_parameters=path_parameters)
                what = f"{op.label} [{mode.value}{', real ids' if path_parameters else ''}]"
                seen = statuses.setdefault(what, set())
                _fuzz(strategy, examples, session, failures, seen, what)
                # A fuzzed pause would leave the target refusing every later operation.
                http.post(f"/sandboxes/{sid}/resume")

    # Everything the fuzzer created goes, and goes for good.
    for sb in http.get("/sandboxes").json()["sandboxes"]:
        assert http.delete(f"/sandboxes/{sb['sandbox_id']}").status_code == 200
    assert http.get("/sandboxes").json()["sandboxes"] == []
    assert http.get("/health").json()["sandboxes"] == 0
    for snap in http.get("/snapshots").json()["snapshots"]:
        assert http.delete(f"/snapshots/{snap['snapshot_id']}").status_code == 200
    assert http.get("/snapshots").json()["snapshots"] == []

    # The PTY websocket is not an HTTP operation; everything else was fuzzed.
    assert not any("/pty" in label for label in labels), labels
    assert {"POST /sandboxes", "POST /sandboxes/{sid}/exec", "PUT /sandboxes/{sid}/files/raw",
            "GET /sandboxes/{sid}/processes/{pid}/output"} <= set(labels), labels
    assert not failures, "\n\n".join(failures)
    # The fuzzer got past validation into the handlers and the sandbox's agent.
    for what in ("POST /sandboxes [positive]", "POST /sandboxes/{sid}/exec [positive, real ids]",
                 "GET /sandboxes/{sid}/processes/{pid}/output [positive, real ids]",
                 "PUT /sandboxes/{sid}/files/raw [positive, real ids]"):
        assert statuses[what] - {422}, (what, statuses[what])
    assert sum(200 in seen for what, seen in statuses.items() if "real ids" in what) >= 5, statuses


# --- malformed requests, by hand ------------------------------------------------------------


def test_invalid_json_is_a_422_with_a_message(http: httpx.Client, sandbox: str) -> None:
    for path in ("/sandboxes", f"/sandboxes/{sandbox}/exec", f"/sandboxes/{sandbox}/apply_patch"):
        r = http.post(path, content=b'{"command": ', headers={"content-type": "application/json"})
        detail = assert_error(r, 422)
        assert detail[0]["type"] == "json_invalid", detail
        assert "JSON" in detail[0]["msg"]


@pytest.mark.parametrize(("route", "body"), [
    ("/sandboxes", {"image": "host", "colour": "red"}),
    ("/sandboxes/{sid}/exec", {"command": "true", "shell": "bash"}),
    ("/sandboxes/{sid}/apply_patch", {"patch": "x", "strip": 1}),
    ("/sandboxes/{sid}/files", {"path": "/workspace/f", "content": "", "owner": "root"}),
    ("/sandboxes/{sid}/files/mkdir", {"path": "/workspace/d", "parents": True}),
])
def test_unknown_fields_are_refused(http: httpx.Client, sandbox: str, route: str,
                                    body: dict) -> None:
    detail = assert_error(http.post(route.format(sid=sandbox), json=body), 422)
    assert [d["type"] for d in detail] == ["extra_forbidden"], detail
    extra = next(k for k in body if k not in ("image", "command", "patch", "path", "content"))
    assert detail[0]["loc"][-1] == extra


@pytest.mark.parametrize("body", [
    {"command": "echo hi", "argv": ["echo", "hi"]},
    {},
    {"env": {"A": "1"}},
    {"argv": []},
])
def test_exec_needs_exactly_one_program(http: httpx.Client, sandbox: str, body: dict) -> None:
    detail = assert_error(http.post(f"/sandboxes/{sandbox}/exec", json=body), 422)
    if body.get("argv") != []:
        assert "exactly one of 'command'" in detail[0]["msg"], detail


@pytest.mark.parametrize("bad", ["Upper", "-leading-dash", "a" * 64, "under_score", "", "dot.ted"])
def test_bad_sandbox_id_is_a_422(http: httpx.Client, bad: str) -> None:
    detail = assert_error(http.post("/sandboxes", json={"sandbox_id": bad}), 422)
    assert detail[0]["loc"] == ["body", "sandbox_id"], detail
    assert all(sb["sandbox_id"] != bad for sb in http.get("/sandboxes").json()["sandboxes"])


@pytest.mark.parametrize(("field", "value"), [
    ("cpu", "lots"), ("cpu", "-1"), ("cpu", "0"), ("memory", "12mb"), ("memory", "1.5q"),
    ("memory", "0"),
])
def test_bad_quantity_is_a_400_naming_it(http: httpx.Client, field: str, value: str) -> None:
    before = len(http.get("/sandboxes").json()["sandboxes"])
    detail = assert_error(http.post("/sandboxes", json={field: value}), 400)
    assert repr(value) in detail and field in detail, detail
    assert len(http.get("/sandboxes").json()["sandboxes"]) == before  # nothing was created


def test_json_body_over_the_limit_is_a_413_pointing_at_raw_upload(http: httpx.Client,
                                                                   sandbox: str) -> None:
    body = json.dumps({"path": "/workspace/big", "content": "QUJD" * JSON_LIMIT}).encode()
    assert len(body) > JSON_LIMIT

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit must be counted
        for i in range(0, len(body), 4096):
            yield body[i:i + 4096]

    for content in (body, chunked()):
        r = http.post(f"/sandboxes/{sandbox}/files", content=content,
                     headers={"content-type": "application/json"})
        detail = assert_error(r, 413)
        assert "/files/raw" in detail and str(JSON_LIMIT) in detail, detail
    # Nothing was written, and the server still takes a body under the limit.
    assert_error(http.get(f"/sandboxes/{sandbox}/files", params={"path": "/workspace/big"}), 404)
    r = http.post(f"/sandboxes/{sandbox}/files", json={"path": "/workspace/ok", "content": "QUJD"})
    assert r.status_code == 200, r.text
    # A base64 download of a file over the JSON limit is refused the same way.
    data = b"z" * (JSON_LIMIT + 1)
    r = http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "/workspace/big"}, content=data)
    assert r.status_code == 200, r.text
    detail = assert_error(http.get(f"/sandboxes/{sandbox}/files",
                                  params={"path": "/workspace/big"}), 413)
    assert "/files/raw" in detail
    assert http.get(f"/sandboxes/{sandbox}/files/raw",
                   params={"path": "/workspace/big"}).content == data


def test_raw_upload_over_the_limit_is_a_413(http: httpx.Client, sandbox: str) -> None:
    path = {"path": "/workspace/up"}
    r = http.put(f"/sandboxes/{sandbox}/files/raw", params=path, content=b"old")
    assert r.status_code == 200

    def chunked() -> Iterator[bytes]:
        for _ in range(UPLOAD_LIMIT // 8192 + 2):
            yield b"n" * 8192

    for content in (b"n" * (UPLOAD_LIMIT + 1), chunked()):
        r = http.put(f"/sandboxes/{sandbox}/files/raw", params=path, content=content)
        detail = assert_error(r, 413)
        assert str(UPLOAD_LIMIT) in detail, detail
        # The refused upload left the old file as it was.
        assert http.get(f"/sandboxes/{sandbox}/files/raw", params=path).content == b"old"
    r = http.put(f"/sandboxes/{sandbox}/files/raw", params=path, content=b"n" * UPLOAD_LIMIT)
    assert r.status_code == 200 and r.json()["size"] == UPLOAD_LIMIT, r.text


def test_max_output_bytes_over_the_cap_is_a_422(http: httpx.Client, sandbox: str) -> None:
    r = http.post(f"/sandboxes/{sandbox}/exec", json={"command": "true",
                                                   "max_output_bytes": (1 << 30) + 1})
    detail = assert_error(r, 422)
    assert detail[0]["loc"] == ["body", "max_output_bytes"], detail
    r = http.post(f"/sandboxes/{sandbox}/exec", json={"command": "true", "max_output_bytes": -1})
    assert_error(r, 422)


def test_unknown_ids_are_404_everywhere(http: httpx.Client, sandbox: str) -> None:
    """Everywhere but DELETE /sandboxes/{id}, which is idempotent (found: false)."""
    missing = "no-such-sandbox"
    job = run(http, sandbox, command="true")["job_id"]
    pid = run(http, sandbox, command="sleep 60", background=True)["process_id"]
    calls: list[tuple[str, str, dict]] = [
        ("GET", f"/sandboxes/{missing}", {}),
        ("GET", f"/sandboxes/{missing}/wait", {"params": {"timeout": 1}}),
        ("POST", f"/sandboxes/{missing}/heartbeat", {}),
        ("POST", f"/sandboxes/{missing}/exec", {"json": {"command": "true"}}),
        ("POST", f"/sandboxes/{missing}/exec", {"json": {"command": "true", "stream": True}}),
        ("POST", f"/sandboxes/{missing}/exec", {"json": {"command": "true", "wait": False}}),
        ("POST", f"/sandboxes/{missing}/apply_patch", {"json": {"patch": "x"}}),
        ("POST", f"/sandboxes/{missing}/files", {"json": {"path": "/f", "content": ""}}),
        ("GET", f"/sandboxes/{missing}/files", {"params": {"path": "/f"}}),
        ("DELETE", f"/sandboxes/{missing}/files", {"params": {"path": "/f"}}),
        ("PUT", f"/sandboxes/{missing}/files/raw", {"params": {"path": "/f"}, "content": b"x"}),
        ("GET", f"/sandboxes/{missing}/files/raw", {"params": {"path": "/f"}}),
        ("GET", f"/sandboxes/{missing}/files/list", {}),
        ("POST", f"/sandboxes/{missing}/files/mkdir", {"json": {"path": "/d"}}),
        ("GET", f"/sandboxes/{missing}/processes", {}),
        ("GET", f"/sandboxes/{missing}/processes/{pid}", {}),
        ("GET", f"/sandboxes/{missing}/processes/{pid}/output", {}),
        ("DELETE", f"/sandboxes/{missing}/processes/{pid}", {}),
        ("GET", "/jobs/job-0000000000000000", {}),
        ("GET", "/jobs/job-0000000000000000/wait", {"params": {"timeout": 1}}),
        ("GET", f"/sandboxes/{sandbox}/processes/proc-nope", {}),
        ("GET", f"/sandboxes/{sandbox}/processes/proc-nope/output", {}),
        ("DELETE", f"/sandboxes/{sandbox}/processes/proc-nope", {}),
        ("GET", f"/sandboxes/{sandbox}/files", {"params": {"path": "/workspace/nope"}}),
        ("GET", f"/sandboxes/{sandbox}/files/raw", {"params": {"path": "/workspace/nope"}}),
        ("GET", f"/sandboxes/{sandbox}/files/list", {"params": {"path": "/workspace/nope"}}),
        ("DELETE", f"/sandboxes/{sandbox}/files", {"params": {"path": "/workspace/nope"}}),
    ]
    for method, path, kwargs in calls:
        r = http.request(method, path, **kwargs)
        detail = assert_error(r, 404)
        assert "nope" in detail or missing in detail or "job-0000" in detail, (path, detail)
    # The real ones answer: the 404s above were about the ids, not the routes.
    assert http.get(f"/jobs/{job}").status_code == 200
    assert http.get(f"/sandboxes/{sandbox}/processes/{pid}").status_code == 200
    assert http.delete(f"/sandboxes/{sandbox}/processes/{pid}").status_code == 200


@pytest.mark.parametrize("pid", ["x y", "x\r\nX-Injected: 1", "p1?stdout_offset=5", "a%2Fb", "é"])
def test_process_ids_cannot_smuggle_into_the_agent_request(http: httpx.Client, sandbox: str,
                                                           pid: str) -> None:
    real = run(http, sandbox, command="echo real; sleep 60", background=True)["process_id"]
    base = f"/sandboxes/{sandbox}/processes/{quote(pid, safe='')}"
    for method, path in (("GET", base), ("GET", f"{base}/output"), ("DELETE", base)):
        detail = assert_error(http.request(method, path), 404)
        assert repr(pid) in detail, (pid, detail)  # the whole id reached the agent, as one id
        # The pooled agent connection is still in step: the next answers are the right ones.
        listing = http.get(f"/sandboxes/{sandbox}/processes")
        assert listing.status_code == 200, listing.text
        assert real in [p["process_id"] for p in listing.json()["processes"]]
        assert run(http, sandbox, command="echo still")["stdout"] == "still\n"
    assert http.get(f"/sandboxes/{sandbox}/processes/{real}").json()["running"]


def test_fork_server_survives_a_client_that_hangs_up(orchestrator: str, data_dir: Path) -> None:
    with (short_data_dir(data_dir) as short, EmbeddedOrchestrator(data_dir=short) as url,
          httpx.Client(base_url=url, timeout=60) as http):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(short / "local" / "zygote.sock"))
        # No wait needed: the fork server accepts one connection at a time, so it has answered
        # (or died on) the hung-up one before it reads this create's request.
        sid = http.post("/sandboxes", json={"image": "host"}).json()["sandbox_id"]
        r = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
        assert r.status_code == 200, r.text
