"""The pieces behind a networked sandbox's egress: its rules, its allow-list's resolver, and the
handle on its network namespace (backends/local/network.py and resolver.py).

The resolver is served on real UDP sockets here; the attacks on all of it from inside a real
sandbox are in tests/attacks/test_egress.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdatatype
import pytest

from orchard.env.backends.local import resolver
from orchard.env.backends.local.network import (
    NetworkError,
    in_netns,
    open_netns,
    resolv_conf,
    ruleset,
)
from orchard.env.backends.local.resolver import AllowListResolver
from tests.conftest import needs_root, wait_until

WEB = ipaddress.ip_address("198.18.29.2")
WEB6 = ipaddress.ip_address("2001:db8::2")
NAMES = {"listed.orchard.test": [WEB, WEB6], "down.orchard.test": []}


def ask(res: AllowListResolver, name: str, rdtype: str = "A") -> dns.message.Message:
    reply = res.answer(dns.message.make_query(name, rdtype).to_wire())
    assert reply is not None
    return dns.message.from_wire(reply)


def addresses(reply: dns.message.Message) -> list[str]:
    return [r.to_text() for rrset in reply.answer for r in rrset]


def test_the_resolver_answers_listed_names_with_the_hosts_addresses() -> None:
    res = AllowListResolver(NAMES, ttl=30)
    a = ask(res, "listed.orchard.test")
    assert a.rcode() == dns.rcode.NOERROR and addresses(a) == [str(WEB)]
    assert a.answer[0].ttl == 30
    assert addresses(ask(res, "listed.orchard.test", "AAAA")) == [str(WEB6)]
    # Names are case-insensitive and may be fully qualified.
    assert addresses(ask(res, "LISTED.Orchard.TEST.")) == [str(WEB)]
    # Other types of a listed name: it exists, with nothing of that type.
    mx = ask(res, "listed.orchard.test", "MX")
    assert mx.rcode() == dns.rcode.NOERROR and mx.answer == []
    # Listed, but the host could not resolve it (yet): try again later.
    assert ask(res, "down.orchard.test").rcode() == dns.rcode.SERVFAIL


def test_the_resolver_knows_no_other_name() -> None:
    res = AllowListResolver(NAMES, ttl=30)
    for name in ("pypi.org", "x.listed.orchard.test", "orchard.test", "c2VjcmV0.attacker.test"):
        reply = ask(res, name)
        assert reply.rcode() == dns.rcode.NXDOMAIN and reply.answer == [], name
    # A refresh replaces the mapping: the old answer goes with it.
    res.names = {"moved.orchard.test": [WEB]}
    assert ask(res, "listed.orchard.test").rcode() == dns.rcode.NXDOMAIN
    assert addresses(ask(res, "moved.orchard.test")) == [str(WEB)]


def test_the_resolver_ignores_what_is_not_a_query() -> None:
    res = AllowListResolver(NAMES, ttl=30)
    assert res.answer(b"\x00\x01garbage") is None
    query = dns.message.make_query("listed.orchard.test", "A")
    response = dns.message.make_response(query)  # answering a response could start a loop
    assert res.answer(response.to_wire()) is None
    query.set_opcode(dns.opcode.STATUS)
    assert dns.message.from_wire(res.answer(query.to_wire()) or b"").rcode() == \
        dns.rcode.REFUSED


def test_a_long_answer_still_fits_one_datagram() -> None:
    name = ".".join(["a" * 60] * 4)[:250]
    many = [ipaddress.ip_address(f"198.18.30.{i}") for i in range(1, 60)]
    res = AllowListResolver({name: many}, ttl=30)
    wire = res.answer(dns.message.make_query(name, "A", use_edns=0).to_wire())
    assert wire is not None and len(wire) <= 512
    reply = dns.message.from_wire(wire)
    assert len(addresses(reply)) == resolver.MAX_ANSWERS
    assert not reply.flags & dns.flags.TC


class Clock:
    """Time as the resolver sees it: it moves by ``step`` at each look, not by the wall clock,
    so what the budget allows depends only on how many queries came."""

    def __init__(self) -> None:
        self.now, self.step = 0.0, 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture()
async def served() -> AsyncIterator[tuple[socket.socket, Clock]]:
    """An AllowListResolver on a real UDP socket, with a clock the test moves."""
    clock = Clock()
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: AllowListResolver(NAMES, 30, clock), local_addr=("127.0.0.1", 0))
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.connect(transport.get_extra_info("sockname"))
    client.setblocking(False)
    yield client, clock
    client.close()
    transport.close()


async def _roundtrip(client: socket.socket, wire: bytes, query_id: int) -> bool:
    """Sends ``wire``, then a plain query with ``query_id``: True if ``wire`` was answered.
    Replies come in order, so the plain query's reply arriving first means none for wire."""
    loop = asyncio.get_running_loop()
    probe = dns.message.make_query("listed.orchard.test", "A")
    probe.id = query_id
    await loop.sock_sendall(client, wire)
    await loop.sock_sendall(client, probe.to_wire())
    first = dns.message.from_wire(await loop.sock_recv(client, 4096))
    if first.id == query_id:
        return False
    await loop.sock_recv(client, 4096)
    return True


async def test_oversized_queries_are_dropped_unread(
        served: tuple[socket.socket, Clock]) -> None:
    client, _ = served
    big = dns.message.make_query("listed.orchard.test", "A", use_edns=0, pad=600).to_wire()
    assert len(big) > resolver.MAX_QUERY
    assert not await _roundtrip(client, big, 1)
    small = dns.message.make_query("listed.orchard.test", "A").to_wire()
    assert await _roundtrip(client, small, 2)


async def test_a_flood_is_cut_at_the_sandboxs_budget(
        served: tuple[socket.socket, Clock]) -> None:
    """A sandbox cannot keep the orchestrator's event loop busy parsing its queries: past its
    burst, queries are dropped until time refills the budget."""
    client, clock = served
    loop = asyncio.get_running_loop()
    query = dns.message.make_query("listed.orchard.test", "A").to_wire()
    for _ in range(int(resolver.BURST)):  # with time standing still
        await loop.sock_sendall(client, query)
        assert dns.message.from_wire(await loop.sock_recv(client, 4096)).answer
    # From now on each query brings 0.6 of one query's worth: the first is dropped, the
    # probe behind it (1.2) is answered, and so on.
    clock.step = 0.6 / resolver.RATE
    assert not await _roundtrip(client, query, 7)
    clock.step = 1 / resolver.RATE
    assert await _roundtrip(client, query, 8)


def test_resolv_conf_names_the_sandboxs_own_resolver_with_an_allow_list() -> None:
    assert resolv_conf(None).startswith("nameserver 10.0.2.3\n")
    assert resolv_conf(["pypi.org"]).startswith(f"nameserver {resolver.ADDRESS}\n")
    assert resolv_conf([]).startswith(f"nameserver {resolver.ADDRESS}\n")


def _chain(rules: str) -> list[str]:
    lines = [line.strip() for line in rules.splitlines()]
    return lines[lines.index("chain output {") + 2:lines.index("jump refuse")]


HOST = [ipaddress.ip_network(a) for a in ("127.0.0.1", "192.0.2.2", "10.1.2.3", "::1",
                                          "2001:db8::7")]


def test_the_host_and_slirp_are_refused_before_any_allow_list() -> None:
    rules = ruleset([ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")], HOST)
    chain = _chain(rules)
    allow = chain.index("ip daddr @allow4 accept")
    refuse4 = next(i for i, line in enumerate(chain) if line.startswith("ip daddr {"))
    refuse6 = next(i for i, line in enumerate(chain) if line.startswith("ip6 daddr {"))
    assert chain[0] == "oif lo accept" and refuse4 < allow and refuse6 < allow
    for refused in ("10.0.2.0/24", "127.0.0.0/8", "169.254.0.0/16", "192.0.2.2", "10.1.2.3"):
        assert refused in chain[refuse4], (refused, chain[refuse4])
    assert "2001:db8::7" in chain[refuse6] and "::1" in chain[refuse6]
    # No way to slirp's forwarder: the allow-list has its own resolver.
    assert not any("10.0.2.3" in line for line in chain), chain


def test_the_default_keeps_the_forwarder_for_dns_only() -> None:
    chain = _chain(ruleset(None, HOST))
    assert chain[1] == "ip daddr 10.0.2.3 meta l4proto { tcp, udp } th dport 53 accept"
    refuse = next(line for line in chain if line.startswith("ip daddr {"))
    # Merged: slirp's network and 10.1.2.3 lie in 10/8, which is listed once.
    assert "10.0.0.0/8" in refuse and "10.0.2.0/24" not in refuse and "10.1.2.3" not in refuse
    assert "192.0.2.2" in refuse


@needs_root
@pytest.mark.root
@pytest.mark.parametrize("allowed", [None, ["0.0.0.0/0", "10.0.0.0/8"], ["::/0"], []])
def test_nft_takes_the_ruleset(allowed: list[str] | None) -> None:
    """Overlapping elements would make nft refuse the table: it checks it (-c) in a network
    namespace of its own."""
    nets = None if allowed is None else [ipaddress.ip_network(a) for a in allowed]
    r = subprocess.run(["unshare", "--net", "nft", "-c", "-f", "-"], input=ruleset(nets, HOST),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture()
def other_netns() -> Iterator[tuple[subprocess.Popen, str]]:
    """A process in a network namespace of its own, and that namespace's name."""
    proc = subprocess.Popen(["unshare", "--net", "sleep", "600"])
    try:
        def unshared() -> bool:
            return os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net")

        assert wait_until(unshared, 10)
        yield proc, os.readlink(f"/proc/{proc.pid}/ns/net")
    finally:
        proc.kill()
        proc.wait()


@needs_root
@pytest.mark.root
def test_a_namespace_handle_is_opened_only_for_a_live_process_of_the_sandbox(
        other_netns: tuple[subprocess.Popen, str]) -> None:
    proc, netns = other_netns
    fd = open_netns(proc.pid, lambda: {proc.pid})
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == netns
        # Work done through the handle happens in that namespace, and only there.
        assert in_netns(fd, lambda: os.readlink("/proc/thread-self/ns/net")) == netns
        assert os.readlink("/proc/thread-self/ns/net") != netns
    finally:
        os.close(fd)
    with pytest.raises(NetworkError, match="not one of the sandbox's"):
        open_netns(proc.pid, lambda: {proc.pid + 1})
    with pytest.raises(NetworkError, match="host's network namespace"):
        open_netns(os.getpid(), lambda: {os.getpid()})
    proc.kill()
    proc.wait()
    with pytest.raises(NetworkError, match="is gone"):
        open_netns(proc.pid, lambda: {proc.pid})
