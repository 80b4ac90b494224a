"""Networked sandboxes: a network namespace of their own, user-mode networking, egress rules.

Every sandbox gets its own network namespace (see ``jail.py``), with only ``lo`` up. For one
created with ``block_network: false`` the backend then attaches slirp4netns, which gives the
namespace a tap device (10.0.2.100/24, gateway 10.0.2.2, DNS forwarder 10.0.2.3) and carries
its traffic out through ordinary sockets of the host, so no host interface, route, bridge or
sysctl is changed. ``--disable-host-loopback`` stops the gateway address from reaching the host's
127.0.0.1, and an nftables table inside the sandbox's namespace (where the sandbox, without
capabilities, cannot change it) decides what may leave:

- always refused, before anything else is looked at: the host's own addresses, slirp4netns's
  network (10.0.2.0/24: its gateway and forwarder are aliases of the host), loopback and
  link-local (cloud metadata at 169.254.169.254);
- by default, the public internet only: loopback inside, DNS to the forwarder, and every
  address outside the private, shared, loopback, multicast and reserved ranges;
- with an ``egress`` allow-list: only its addresses and networks (names resolved on the host
  and re-resolved while the sandbox lives). DNS goes to the sandbox's own resolver
  (``resolver.py``), which answers for the listed names only; slirp4netns's forwarder is
  refused, and switched off as well.

Everything else is rejected at once (a TCP reset or an ICMP error), so attempts fail fast and
no packet of theirs reaches the host's network. slirp4netns runs in the sandbox's cgroups (a
delete kills it with the rest) and exits when the sandbox's holder does (its exit fd's other
end is held only by the holder).

The host acts on a sandbox's namespace only through a handle (an fd of it) opened at launch,
or at adoption after a restart from a pid it checked (see ``open_netns``), never through a
pid read later: a pid may by then name another process.
"""

from __future__ import annotations

import asyncio
import ctypes
import ipaddress
import json
import logging
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from orchard.env.backends.local import resolver
from orchard.env.backends.local.resolver import AllowListResolver, IPAddress
from orchard.env.errors import OrchestratorError
from orchard.env.schema import IPNetwork, parse_egress_entry

log = logging.getLogger("orchard.env")
SLIRP_DNS = "10.0.2.3"
EGRESS_FILE = "egress.json"  # the allow-list as asked for: names are re-resolved from it
# Never reachable by default: private (RFC 1918), shared (RFC 6598), link-local (cloud
# metadata at 169.254.169.254), loopback, "this network", multicast and reserved ranges.
BLOCKED_V4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
              "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4")
# Never reachable, whatever an allow-list says (the host's own addresses are added): slirp's
# network, whose gateway and forwarder lead to the host and its resolver; loopback; and
# link-local, where clouds serve instance metadata and credentials.
ALWAYS_REFUSED_V4 = ("10.0.2.0/24", "127.0.0.0/8", "169.254.0.0/16")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


class NetworkError(OrchestratorError, RuntimeError):
    pass


def resolv_conf(egress: Sequence[str] | None) -> str:
    """The sandbox's /etc/resolv.conf: slirp4netns's forwarder, or with an allow-list the
    sandbox's own resolver."""
    server = SLIRP_DNS if egress is None else resolver.ADDRESS
    return f"nameserver {server}\noptions timeout:2 attempts:2\n"


@dataclass(frozen=True)
class Resolution:
    """One resolution of an allow-list: what its rules allow and what its resolver answers."""

    networks: list[IPNetwork]
    names: dict[str, list[IPAddress]]


def resolve(entries: Sequence[str]) -> Resolution:
    """What an allow-list opens: every entry as networks, names by the host's resolver, and
    what each name resolved to (a name that does not resolve now contributes nothing, and is
    tried again at the next refresh)."""
    networks: set[IPNetwork] = set()
    names: dict[str, list[IPAddress]] = {}
    for entry in entries:
        parsed = parse_egress_entry(entry)
        if not isinstance(parsed, str):
            networks.add(parsed)
            continue
        try:
            infos = socket.getaddrinfo(parsed, None, proto=socket.IPPROTO_TCP)
        except OSError:
            infos = []
        found = {ipaddress.ip_address(info[4][0]) for info in infos}
        names[parsed] = sorted(found, key=lambda a: (a.version, a))
        networks.update(ipaddress.ip_network(a) for a in found)
    return Resolution(sorted(networks, key=lambda n: (n.version, n)), names)


_HOST_ADDRESSES: tuple[float, list[IPNetwork]] = (0.0, [])
HOST_ADDRESSES_TTL = 10.0  # seconds a listing of the host's addresses is reused


def host_addresses() -> list[IPNetwork]:
    """The host's own addresses: a sandbox must not reach its services by them either.

    Listed at most every HOST_ADDRESSES_TTL seconds: a burst of creates needs one listing.
    """
    global _HOST_ADDRESSES
    listed_at, addrs = _HOST_ADDRESSES
    if time.monotonic() - listed_at < HOST_ADDRESSES_TTL:
        return addrs
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=False)
    addrs = [ipaddress.ip_network(a["local"]) for link in json.loads(out.stdout or "[]")
             for a in link.get("addr_info", [])]
    _HOST_ADDRESSES = (time.monotonic(), addrs)
    return addrs


def _elements(networks: Iterable[IPNetwork]) -> str:
    # An interval set refuses overlapping elements: merge them first.
    return ", ".join(str(n) for n in ipaddress.collapse_addresses(networks))


def ruleset(allowed: Sequence[IPNetwork] | None, host: Iterable[IPNetwork]) -> str:
    """The nftables table of a networked sandbox. ``allowed`` None: the public internet."""
    host = list(host)
    v4 = [str(n) for n in allowed or () if n.version == 4]
    v6 = [str(n) for n in allowed or () if n.version == 6]
    refused4 = [*map(ipaddress.IPv4Network, ALWAYS_REFUSED_V4),
                *(n for n in host if isinstance(n, ipaddress.IPv4Network))]
    if allowed is None:
        refused4 += map(ipaddress.IPv4Network, BLOCKED_V4)
    refused6 = [n for n in host if isinstance(n, ipaddress.IPv6Network)]
    lines = [
        "table inet orchard {",
        " set allow4 { type ipv4_addr; flags interval; auto-merge;"
        + (f" elements = {{ {', '.join(v4)} }};" if v4 else "") + " }",
        " set allow6 { type ipv6_addr; flags interval; auto-merge;"
        + (f" elements = {{ {', '.join(v6)} }};" if v6 else "") + " }",
        " chain output {",
        "  type filter hook output priority 0; policy accept;",
        "  oif lo accept",
    ]
    if allowed is None:
        # The sandbox reaches the public internet anyway; an allow-list's has its own resolver.
        lines.append(f"  ip daddr {SLIRP_DNS} meta l4proto {{ tcp, udp }} th dport 53 accept")
    lines.append(f"  ip daddr {{ {_elements(refused4)} }} jump refuse")
    if refused6:
        lines.append(f"  ip6 daddr {{ {_elements(refused6)} }} jump refuse")
    lines += ["  ip daddr @allow4 accept", "  ip6 daddr @allow6 accept"]
    if allowed is None:
        lines.append("  ip version 4 accept")
    # IPv6 stays closed unless allowed: slirp4netns carries IPv4 only here anyway.
    lines += ["  jump refuse", " }",
              " chain refuse {",
              "  meta l4proto tcp reject with tcp reset",
              "  reject with icmpx type admin-prohibited",
              " }", "}"]
    return "\n".join(lines) + "\n"


def open_netns(pid: int, members: Callable[[], Collection[int]]) -> int:
    """An fd of the network namespace of ``pid``, a process of the sandbox's whose processes
    ``members`` lists; NetworkError if it is not one.

    A pid is only a number that the kernel hands out again once its process is gone. So the
    process is pinned first (a pidfd), checked to be in the sandbox's cgroups, and after its
    namespace is open the pidfd must show it still alive: then the pid named that same process
    all along, and the namespace is the sandbox's.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:
        raise NetworkError(f"process {pid} of the sandbox is gone ({e.strerror})") from None
    netns = -1
    try:
        if pid not in members():
            raise NetworkError(f"process {pid} is not one of the sandbox's")
        netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        ns, own = os.fstat(netns), os.stat("/proc/self/ns/net")
        if select.select([pidfd], [], [], 0)[0]:
            raise NetworkError(f"process {pid} of the sandbox exited")
        if (ns.st_dev, ns.st_ino) == (own.st_dev, own.st_ino):
            raise NetworkError(f"process {pid} is in the host's network namespace")
        found, netns = netns, -1
        return found
    except OSError as e:
        raise NetworkError(f"cannot open the network namespace of process {pid}: {e}") from None
    finally:
        os.close(pidfd)
        if netns >= 0:
            os.close(netns)


def in_netns(netns: int, fn: Callable[[], T]) -> T:
    """``fn()`` in a thread of its own that joins the network namespace ``netns`` (an fd):
    sockets it makes belong to that namespace. The thread ends there, so no other work ever
    runs in a sandbox's namespace by mistake."""
    result: list[T] = []
    error: list[BaseException] = []

    def inside() -> None:
        try:
            if _libc.setns(netns, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetworkError(f"setns into the sandbox's network namespace failed: "
                                   f"{os.strerror(err)}")
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            error.append(e)

    thread = threading.Thread(target=inside, name="orchard-netns")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _resolver_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((resolver.ADDRESS, 53))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _nft(netns: int, script: str) -> None:
    """Run an nft script in the network namespace ``netns`` (an fd, passed to nsenter)."""
    r = subprocess.run(["nsenter", f"--net=/proc/self/fd/{netns}", "nft", "-f", "-"],
                       input=script, pass_fds=(netns,), capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        raise NetworkError(f"nft in the sandbox's network namespace failed: "
                           f"{r.stderr.strip()[-500:]}")


def apply_rules(netns: int, allowed: Sequence[IPNetwork] | None) -> None:
    """Install the egress table in the network namespace ``netns`` (an fd)."""
    _nft(netns, ruleset(allowed, host_addresses()))


def update_allowed(netns: int, allowed: Sequence[IPNetwork]) -> None:
    """Replace the allow-list's addresses atomically (one nft transaction)."""
    script = ["flush set inet orchard allow4", "flush set inet orchard allow6"]
    for version, name in ((4, "allow4"), (6, "allow6")):
        nets = [str(n) for n in allowed if n.version == version]
        if nets:
            script.append(f"add element inet orchard {name} {{ {', '.join(nets)} }}")
    _nft(netns, "\n".join(script) + "\n")


def start_slirp(netns: int, exit_fd: int, procs_files: Sequence[Path], log: Path,
                forward_dns: bool, timeout: float = 10.0) -> subprocess.Popen[bytes]:
    """Attach slirp4netns to the network namespace ``netns`` (an fd); returns it once the
    namespace is configured. It joins the sandbox's cgroups first thing. Without
    ``forward_dns`` its forwarder is off too (the rules refuse it already). The caller reaps
    it."""
    ready_r, ready_w = os.pipe()
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
                 *(() if forward_dns else ("--disable-dns",)),
                 "--enable-sandbox", "--enable-seccomp", "--exit-fd", str(exit_fd),
                 "--ready-fd", str(ready_w), "--netns-type=path", f"/proc/self/fd/{netns}",
                 "tap0"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                pass_fds=(exit_fd, ready_w, netns), start_new_session=True)
        for procs in procs_files:
            procs.write_text(str(proc.pid))
        os.close(ready_w)
        ready_w = -1
        deadline = time.monotonic() + timeout
        os.set_blocking(ready_r, False)
        while time.monotonic() < deadline:
            try:
                if os.read(ready_r, 1):
                    return proc
                break  # EOF: it exited without configuring
            except BlockingIOError:
                if proc.poll() is not None:
                    break
                time.sleep(0.001)
        proc.kill()
        proc.wait()
        raise NetworkError(f"slirp4netns did not configure the sandbox's network; see {log}")
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)


def save_egress(sdir: Path, egress: Sequence[str] | None) -> None:
    (sdir / EGRESS_FILE).write_text(json.dumps({"egress": list(egress) if egress is not None
                                                else None}))


def load_egress(sdir: Path) -> list[str] | None:
    try:
        return json.loads((sdir / EGRESS_FILE).read_text())["egress"]
    except (OSError, ValueError, KeyError):
        return None


@dataclass
class _Guarded:
    """What the orchestrator holds for one allow-listed sandbox."""

    entries: list[str]
    netns: int  # an fd of its network namespace
    resolution: Resolution
    resolver: AllowListResolver
    transport: asyncio.DatagramTransport

    def close(self) -> None:
        self.transport.close()
        os.close(self.netns)


class EgressRules:
    """The egress tables of one data dir's networked sandboxes, their allow-lists' names kept
    current, and the resolvers of allow-listed sandboxes.

    What each sandbox asked for is saved in its dir (``egress.json``, host root's), so an
    orchestrator that re-adopts sandboxes after a restart makes their resolvers again and
    refreshes their names too.
    """

    def __init__(self, sandboxes_dir: Path, refresh: float) -> None:
        self.sandboxes_dir = sandboxes_dir
        self.refresh = refresh
        self.ttl = max(1, min(300, int(refresh)))  # answers live no longer than a refresh
        self._guarded: dict[str, _Guarded] = {}
        self._opening: set[str] = set()  # being installed or adopted right now
        self._task: asyncio.Task[None] | None = None

    async def install(self, sandbox_id: str, netns: int, egress: Sequence[str] | None) -> None:
        """Resolve, save and apply a new sandbox's rules in its network namespace ``netns`` (an
        fd, which stays the caller's); with an allow-list, also start its resolver there.
        Before any sandbox code runs."""
        save_egress(self.sandboxes_dir / sandbox_id, egress)
        if egress is None:
            await asyncio.to_thread(apply_rules, netns, None)
            return
        self._opening.add(sandbox_id)
        try:
            await self._guard(sandbox_id, list(egress), os.dup(netns), fresh=True)
        finally:
            self._opening.discard(sandbox_id)

    async def adopt(self, sandbox_id: str, agent: int,
                    members: Callable[[], Collection[int]]) -> None:
        """After a restart: take a handle on the namespace of the sandbox's ``agent`` again and
        start its resolver, if it has an allow-list and nothing holds it yet."""
        if sandbox_id in self._guarded or sandbox_id in self._opening:
            return
        entries = load_egress(self.sandboxes_dir / sandbox_id)
        if entries is None:
            return
        self._opening.add(sandbox_id)
        try:
            netns = await asyncio.to_thread(open_netns, agent, members)
            await self._guard(sandbox_id, entries, netns, fresh=False)
        except NetworkError as e:
            log.warning("sandbox %s: its allow-list's resolver is not running: %s",
                        sandbox_id, e)
        finally:
            self._opening.discard(sandbox_id)

    async def _guard(self, sandbox_id: str, entries: list[str], netns: int,
                     fresh: bool) -> None:
        """Resolve ``entries``, put them in the rules of ``netns`` (a new table if ``fresh``,
        else the existing table's allow sets) and serve the resolver there. Takes ``netns``;
        gives up if the sandbox is forgotten meanwhile."""
        transport = None
        try:
            resolution = await asyncio.to_thread(resolve, entries)
            await asyncio.to_thread(apply_rules if fresh else update_allowed, netns,
                                    resolution.networks)
            served = AllowListResolver(resolution.names, self.ttl)
            sock = await asyncio.to_thread(in_netns, netns, _resolver_socket)
            try:
                transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                    lambda: served, sock=sock)
            except BaseException:
                sock.close()
                raise
            if sandbox_id not in self._opening:
                raise NetworkError(f"sandbox {sandbox_id} was deleted meanwhile")
            self._guarded[sandbox_id] = _Guarded(entries, netns, resolution, served, transport)
            netns, transport = -1, None
        except OSError as e:
            raise NetworkError(f"cannot serve the sandbox's resolver: {e}") from None
        finally:
            if transport is not None:
                transport.close()
            if netns >= 0:
                os.close(netns)

    def forget(self, sandbox_id: str) -> None:
        """Close what this orchestrator holds for the sandbox (its namespace, its resolver)."""
        self._opening.discard(sandbox_id)
        guarded = self._guarded.pop(sandbox_id, None)
        if guarded is not None:
            guarded.close()

    async def refresh_once(self) -> None:
        """Re-resolve the names in every allow-list; apply what changed."""
        for sandbox_id, guarded in list(self._guarded.items()):
            if not guarded.resolution.names:
                continue
            resolution = await asyncio.to_thread(resolve, guarded.entries)
            if resolution == guarded.resolution or self._guarded.get(sandbox_id) is not guarded:
                continue
            # A copy of the handle: a delete meanwhile closes the original, and its number
            # may then name something else.
            netns = os.dup(guarded.netns)
            try:
                await asyncio.to_thread(update_allowed, netns, resolution.networks)
            except NetworkError as e:
                log.warning("egress refresh of %s failed: %s", sandbox_id, e)
                continue
            finally:
                os.close(netns)
            guarded.resolution = resolution
            guarded.resolver.names = resolution.names

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for sandbox_id in list(self._guarded):
            self.forget(sandbox_id)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            try:
                await self.refresh_once()
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.exception("egress refresh pass failed")
