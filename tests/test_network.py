"""Networked sandbox (block_network=false): its own network namespace, and nothing near it.

An escape battery runs from inside an open sandbox, and every attempt must be refused: the
host's loopback (the orchestrator's own API), the host's addresses, another sandbox, the
cloud metadata address, private ranges, and a port bound inside showing up on the host.
What is allowed must still work: a test server in a network namespace this test creates,
on a "public" address (198.18.0.0/15, the benchmarking range) and on a private one (10.x)
that only an allow-list opens. No traffic leaves this machine: the addresses live in the
test's own namespace, names are asked of a resolver of the test's own, and refused packets
never leave the sandbox's.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import httpx
import pytest

from orchard.env.backends.local.host_state import remove_leftovers
from tests.conftest import (
    create_ready,
    dedicated_orchestrator,
    free_port,
    needs_root,
    run,
    short_data_dir,
    wait_until,
)

pytestmark = [needs_root, pytest.mark.root]

PUBLIC, PRIVATE = "198.18.7.2", "10.213.7.2"  # the upstream's web server's addresses
LINK_LOCAL = "169.254.7.2"  # and one where clouds serve metadata (169.254.169.254 is not ours)
# One address of each other range a sandbox must not reach, also served by the upstream, so
# that a broken rule would send the probe into this test's namespace, never off the machine.
FORBIDDEN = ("172.16.7.2", "192.168.7.2", "100.64.7.2")
RESOLVER = "198.18.7.1"  # the host's end of the upstream's link, where name_server listens
PORT = 8080

# Connect to each (host, port) in argv; print one line "host:port OK|REFUSED <why>" each.
PROBE = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((host, int(port)))
        s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        print(target, "OK", s.recv(12).decode(errors="replace").split()[0:2])
    except OSError as e:
        print(target, "REFUSED", type(e).__name__)
    finally:
        s.close()
"""


def probe(http: httpx.Client, sid: str, *targets: str) -> dict[str, str]:
    r = run(http, sid, argv=["python3", "-c", PROBE, *targets], timeout_seconds=60)
    assert r["exit_code"] == 0, r
    return {line.split()[0]: line.split()[1] for line in r["stdout"].splitlines()}


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """A network namespace of this test's own with an HTTP server on all its addresses."""
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"orchard-test-{tag}", f"ot{tag}h", f"ot{tag}n"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", ns)
    server = None
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        for addr in ("198.18.7.1/24", "10.213.7.1/24"):
            ip("addr", "add", addr, "dev", host_if)
        ip("link", "set", host_if, "up")
        # Only this address of the link-local range is routed here: the host's own
        # link-local route (and any metadata service behind it) stays as it was.
        for routed in (LINK_LOCAL, *FORBIDDEN):
            ip("route", "add", f"{routed}/32", "dev", host_if)
        for addr in (f"{PUBLIC}/24", f"{PRIVATE}/24", f"{LINK_LOCAL}/16",
                     *(f"{a}/32" for a in FORBIDDEN)):
            ip("netns", "exec", ns, "ip", "addr", "add", addr, "dev", ns_if)
        ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", str(PORT),
             "--bind", "0.0.0.0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up() -> bool:
            with contextlib.suppress(OSError), socket.create_connection((PUBLIC, PORT), 1):
                return True
            return False

        assert wait_until(up, 15, 0.1), "the upstream test server did not start"
        yield ns
    finally:
        if server is not None:
            server.kill()
            server.wait(10)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def host_listener() -> Iterator[int]:
    """A service on every host address (0.0.0.0), as an orchestrator with --host 0.0.0.0."""
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True)
    return [a["local"] for link in json.loads(out.stdout) for a in link["addr_info"]]


def test_the_escape_battery_is_refused(http: httpx.Client, orchestrator: str, upstream: str,
                                       host_listener: int) -> None:
    api_port = httpx.URL(orchestrator).port
    assert api_port is not None
    sid = create_ready(http, {"image": "host", "block_network": False})
    other = create_ready(http, {"image": "host", "block_network": False})
    try:
        # The other sandbox serves on every address it has.
        run(http, other, command=f"python3 -m http.server {PORT} >/dev/null 2>&1 & echo up")
        assert wait_until(lambda: probe(http, other, f"127.0.0.1:{PORT}")[f"127.0.0.1:{PORT}"]
                          == "OK", 10, 0.2)
        targets = [
            f"127.0.0.1:{api_port}",             # its own loopback: nothing there
            f"10.0.2.2:{api_port}",               # the gateway, which could map host loopback
            f"10.0.2.2:{host_listener}",
            *(f"{a}:{api_port}" for a in _host_addresses()),        # the host, by its addresses
            *(f"{a}:{host_listener}" for a in _host_addresses()),
            f"10.0.2.100:{PORT}",                 # the other sandbox's address, as seen inside
            f"{LINK_LOCAL}:{PORT}",               # link-local, where clouds serve metadata
            f"{PRIVATE}:{PORT}",                  # a private range, with a server really there
            *(f"{a}:{PORT}" for a in FORBIDDEN),  # the other private and shared ranges
        ]
        # The host listener answers on the host, so a refusal inside is the sandbox's doing.
        with socket.create_connection(("127.0.0.1", host_listener), 2):
            pass
        for served in (LINK_LOCAL, PRIVATE, *FORBIDDEN):  # and these answer the host
            with socket.create_connection((served, PORT), 2):
                pass
        results = probe(http, sid, *targets)
        leaked = {t: r for t, r in results.items() if r != "REFUSED"}
        assert not leaked, leaked
        assert len(results) == len(set(targets))
        # A port bound inside is not a port on the host.
        run(http, sid, command="python3 -m http.server 18555 >/dev/null 2>&1 & echo up")
        assert wait_until(lambda: probe(http, sid, "127.0.0.1:18555")["127.0.0.1:18555"]
                          == "OK", 10, 0.2)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", 18555), 2).close()
        # The public side is reachable: a networked sandbox is not a blocked one.
        assert probe(http, sid, f"{PUBLIC}:{PORT}") == {f"{PUBLIC}:{PORT}": "OK"}
    finally:
        http.delete(f"/sandboxes/{sid}")
        http.delete(f"/sandboxes/{other}")


def test_an_allow_list_opens_only_what_it_lists(http: httpx.Client, upstream: str) -> None:
    sid = create_ready(http, {"image": "host", "block_network": False,
                              "egress": ["10.213.7.0/24"]})
    try:
        assert http.get(f"/sandboxes/{sid}").json()["egress"] == ["10.213.7.0/24"]
        assert probe(http, sid, f"{PRIVATE}:{PORT}", f"{PUBLIC}:{PORT}") == {
            f"{PRIVATE}:{PORT}": "OK", f"{PUBLIC}:{PORT}": "REFUSED"}
    finally:
        http.delete(f"/sandboxes/{sid}")


@contextlib.contextmanager
def name_server(address: str, names: dict[str, str]) -> Iterator[list[str]]:
    """A DNS server on ``address``:53, UDP and TCP, that answers A queries for ``names`` (the
    caller may change them meanwhile; NXDOMAIN for others); yields the names it was asked."""
    asked: list[str] = []

    def reply(wire: bytes) -> bytes:
        query = dns.message.from_wire(wire)
        response = dns.message.make_response(query)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        asked.append(name)
        if name not in names:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A:
            response.answer.append(dns.rrset.from_text(question.name, 1, "IN", "A",
                                                       names[name]))
        return response.to_wire()

    class Udp(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data, sock = self.request
            sock.sendto(reply(data), self.client_address)

    class Tcp(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            size = int.from_bytes(self.rfile.read(2), "big")
            out = reply(self.rfile.read(size))
            self.wfile.write(len(out).to_bytes(2, "big") + out)

    class TcpServer(socketserver.ThreadingTCPServer):
        allow_reuse_address = True  # the next test binds it again, its connections in TIME_WAIT
        daemon_threads = True

    servers = [socketserver.ThreadingUDPServer((address, 53), Udp), TcpServer((address, 53), Tcp)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield asked
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


class Served:
    """`orchard serve` in a child process with a mount namespace of its own, where
    /etc/resolv.conf names ``resolver``: for it, and the slirp4netns it starts, the host's
    resolver is that one. The host's own file is untouched. Its sandboxes outlive it (see
    kill and start), until stop deletes them."""

    def __init__(self, data: Path, resolver: str, log: Path, **settings: object) -> None:
        self.data, self.log, self.port = data, log, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (data / "resolv.conf").write_text(f"nameserver {resolver}\n")
        extra = "".join(f", {k}={v!r}" for k, v in settings.items())
        self.code = ("from pathlib import Path; from orchard.env.server import serve; "
                     f"serve(port={self.port}, data_dir=Path({str(data)!r}), "
                     f"log_level='warning'{extra})")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 'mount --bind "$0" /etc/resolv.conf && exec "$@"',
                 str(self.data / "resolv.conf"), sys.executable, "-c", self.code],
                stdout=out, stderr=out)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
            return False

        assert wait_until(up, 60, 0.1), self.log.read_text()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with httpx.Client(base_url=self.url, timeout=60) as api, \
                    contextlib.suppress(httpx.HTTPError):
                for sb in api.get("/sandboxes").json()["sandboxes"]:
                    api.delete(f"/sandboxes/{sb['sandbox_id']}")
            self.proc.terminate()
            self.proc.wait(30)
        remove_leftovers(self.data / "local")  # whatever a failed test left running


@contextlib.contextmanager
def orchestrator_whose_resolver_is(resolver: str, session_data: Path, log: Path,
                                   **settings: object) -> Iterator[Served]:
    """A started ``Served`` on a short data dir (reusing the session's bundle)."""
    with short_data_dir(session_data) as short:
        server = Served(short, resolver, log, **settings)
        try:
            server.start()
            yield server
        finally:
            server.stop()


def test_dns_goes_through_the_sandboxs_own_forwarder(data_dir: Path, orchestrator: str,
                                                     upstream: str, tmp_path: Path) -> None:
    """The host's resolv.conf may name a private or loopback resolver, which the rules
    refuse: the sandbox gets slirp4netns's forwarder, which asks the host's resolvers. The
    host's resolver here is this test's (on the host's end of its veth), so no query leaves
    the machine."""
    del orchestrator, upstream  # the bundle it built; the address the resolver listens on
    name = "upstream.orchard.test"
    with name_server(RESOLVER, {name: PUBLIC}) as asked, orchestrator_whose_resolver_is(
            RESOLVER, data_dir, tmp_path / "serve.log") as server, \
            httpx.Client(base_url=server.url, timeout=120) as api:
        sid = create_ready(api, {"image": "host", "block_network": False})
        assert run(api, sid, command="cat /etc/resolv.conf")["stdout"].startswith(
            "nameserver 10.0.2.3")
        got = run(api, sid, command=f"getent ahostsv4 {name} | awk '{{print $1}}' | sort -u",
                  timeout_seconds=30)["stdout"].split()
        assert got == [PUBLIC], (got, asked)
        assert name in asked
        assert run(api, sid, command="getent ahostsv4 pypi.org")["exit_code"] == 2


@pytest.mark.parametrize("body, needle", [
    ({"block_network": False, "egress": ["pypi.org", "not a host!"]}, "not a host!"),
    ({"block_network": False, "egress": ["10.0.0.0/33"]}, "10.0.0.0/33"),
    ({"block_network": True, "egress": ["pypi.org"]}, "block_network"),
])
def test_bad_allow_lists_are_422_naming_the_entry(http: httpx.Client, body: dict,
                                                  needle: str) -> None:
    r = http.post("/sandboxes", json={"image": "host", **body})
    assert r.status_code == 422, r.text
    assert needle in r.text


def test_names_are_resolved_and_kept_current(data_dir: Path, orchestrator: str,
                                             upstream: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A name in the allow-list follows its DNS answer while the sandbox lives. No DNS
    server can be had here, so the orchestrator's resolver (in this process) is replaced
    for one made-up name; everything after the answer is real."""
    del orchestrator  # only for the bundle
    answer = {"ip": PUBLIC}
    real = socket.getaddrinfo

    def fake(host: str, *args: object, **kw: object) -> list:
        if host == "upstream.orchard.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer["ip"], 0))]
        return real(host, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with dedicated_orchestrator(data_dir, egress_refresh=0.3) as url, \
            httpx.Client(base_url=url, timeout=60) as api:
        sid = create_ready(api, {"image": "host", "block_network": False,
                                 "egress": ["upstream.orchard.test"]})
        assert probe(api, sid, f"{PUBLIC}:{PORT}", f"{PRIVATE}:{PORT}") == {
            f"{PUBLIC}:{PORT}": "OK", f"{PRIVATE}:{PORT}": "REFUSED"}
        answer["ip"] = PRIVATE

        def moved() -> bool:
            return probe(api, sid, f"{PUBLIC}:{PORT}", f"{PRIVATE}:{PORT}") == {
                f"{PUBLIC}:{PORT}": "REFUSED", f"{PRIVATE}:{PORT}": "OK"}

        assert wait_until(moved, 20, 0.3)


def _slirps() -> set[int]:
    found = set()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            # Zombies count: a child nobody reaps is a leak too.
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == "slirp4netns":
                found.add(int(proc.name))
    return found


def test_the_network_goes_with_the_sandbox(http: httpx.Client) -> None:
    before = _slirps()
    sid = create_ready(http, {"image": "host", "block_network": False})
    mine = _slirps() - before
    assert len(mine) == 1, mine
    # It runs in the sandbox's cgroups, so limits and the teardown cover it.
    cgroup = Path(f"/proc/{next(iter(mine))}/cgroup").read_text()
    assert f"/{sid}\n" in cgroup, cgroup
    assert http.delete(f"/sandboxes/{sid}").status_code == 200
    assert wait_until(lambda: not (mine & _slirps()), 15, 0.1)


def test_private_ranges_list_is_complete() -> None:
    from orchard.env.backends.local.network import BLOCKED_V4

    blocked = [ipaddress.IPv4Network(n) for n in BLOCKED_V4]
    for probe_addr in ("10.1.2.3", "172.31.255.1", "192.168.77.1", "169.254.169.254",
                       "100.100.100.100", "127.0.0.53", "0.0.0.0", "224.0.0.251"):
        assert any(ipaddress.IPv4Address(probe_addr) in n for n in blocked), probe_addr
    for public in ("198.18.7.2", "1.1.1.1", "203.0.113.80"):
        assert not any(ipaddress.IPv4Address(public) in n for n in blocked), public
