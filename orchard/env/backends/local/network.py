"""Networked sandboxes: a network namespace of their own, user-mode networking, egress rules.

Every sandbox gets its own network namespace (bwrap --unshare-net). For one created with
``block_network: false`` the backend then attaches slirp4netns, which gives the namespace a
tap device (10.0.2.100/24, gateway 10.0.2.2, DNS forwarder 10.0.2.3) and carries its traffic
out through ordinary sockets of the host, so no host interface, route, bridge or sysctl is
changed. ``--disable-host-loopback`` stops the gateway address from reaching the host's
127.0.0.1, and an nftables table inside the sandbox's namespace (where the sandbox, without
capabilities, cannot change it) decides what may leave:

- by default, the public internet only: loopback inside, the DNS forwarder, and every address
  outside the private, shared, link-local, loopback and multicast ranges and the host's own;
- with an ``egress`` allow-list: only its addresses and networks (names resolved on the host
  and re-resolved while the sandbox lives), plus DNS.

Everything else is rejected at once (a TCP reset or an ICMP error), so attempts fail fast and
no packet of theirs reaches the host's network. slirp4netns runs in the sandbox's cgroups (a
delete kills it with the rest) and exits when the sandbox's holder does (its exit fd's other
end is held only by the holder).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from orchard.env.schema import IPNetwork, parse_egress_entry

log = logging.getLogger("orchard.env")
SLIRP_DNS = "10.0.2.3"
RESOLV_CONF = f"nameserver {SLIRP_DNS}\noptions timeout:2 attempts:2\n"
EGRESS_FILE = "egress.json"  # the allow-list as asked for: names are re-resolved from it
# Never reachable by default: private (RFC 1918), shared (RFC 6598), link-local (cloud
# metadata at 169.254.169.254), loopback, "this network", multicast and reserved ranges.
BLOCKED_V4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
              "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4")


class NetworkError(RuntimeError):
    pass


def resolve(entries: Sequence[str]) -> list[IPNetwork]:
    """Every entry as networks; names by the host's resolver (a name that does not resolve
    now contributes nothing, and is tried again at the next refresh)."""
    found: list[IPNetwork] = []
    for entry in entries:
        parsed = parse_egress_entry(entry)
        if not isinstance(parsed, str):
            found.append(parsed)
            continue
        try:
            infos = socket.getaddrinfo(parsed, None, proto=socket.IPPROTO_TCP)
        except OSError:
            continue
        found.extend(ipaddress.ip_network(info[4][0]) for info in infos)
    return sorted(set(found), key=lambda n: (n.version, n))


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


def ruleset(allowed: Sequence[IPNetwork] | None, host: Iterable[IPNetwork]) -> str:
    """The nftables table of a networked sandbox. ``allowed`` None: the public internet."""
    v4 = [str(n) for n in allowed or () if n.version == 4]
    v6 = [str(n) for n in allowed or () if n.version == 6]
    lines = [
        "table inet orchard {",
        " set allow4 { type ipv4_addr; flags interval; auto-merge;"
        + (f" elements = {{ {', '.join(v4)} }};" if v4 else "") + " }",
        " set allow6 { type ipv6_addr; flags interval; auto-merge;"
        + (f" elements = {{ {', '.join(v6)} }};" if v6 else "") + " }",
        " chain output {",
        "  type filter hook output priority 0; policy accept;",
        "  oif lo accept",
        f"  ip daddr {SLIRP_DNS} meta l4proto {{ tcp, udp }} th dport 53 accept",
        "  ip daddr @allow4 accept",
        "  ip6 daddr @allow6 accept",
    ]
    if allowed is None:
        ranges = [ipaddress.IPv4Network(r) for r in BLOCKED_V4]
        # An interval set refuses overlapping elements: add host addresses not covered.
        extra = {n for n in host if isinstance(n, ipaddress.IPv4Network)
                 and not any(n.subnet_of(r) for r in ranges)}
        blocked = ", ".join(str(n) for n in sorted({*ranges, *extra}))
        lines.append(f"  ip daddr {{ {blocked} }} jump refuse")
        lines.append("  ip version 4 accept")
    # IPv6 stays closed unless allowed: slirp4netns carries IPv4 only here anyway.
    lines += ["  jump refuse", " }",
              " chain refuse {",
              "  meta l4proto tcp reject with tcp reset",
              "  reject with icmpx type admin-prohibited",
              " }", "}"]
    return "\n".join(lines) + "\n"


def _in_netns(pid: int, argv: list[str], stdin: str | None = None) -> None:
    r = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", *argv], input=stdin,
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} in the sandbox's network namespace failed: "
                           f"{r.stderr.strip()[-500:]}")


def apply_rules(pid: int, allowed: Sequence[IPNetwork] | None) -> None:
    """Install the egress table in the network namespace of process ``pid``."""
    _in_netns(pid, ["nft", "-f", "-"], ruleset(allowed, host_addresses()))


def update_allowed(pid: int, allowed: Sequence[IPNetwork]) -> None:
    """Replace the allow-list's addresses atomically (one nft transaction)."""
    script = ["flush set inet orchard allow4", "flush set inet orchard allow6"]
    for version, name in ((4, "allow4"), (6, "allow6")):
        nets = [str(n) for n in allowed if n.version == version]
        if nets:
            script.append(f"add element inet orchard {name} {{ {', '.join(nets)} }}")
    _in_netns(pid, ["nft", "-f", "-"], "\n".join(script) + "\n")


def start_slirp(pid: int, exit_fd: int, procs_files: Sequence[Path], log: Path,
                timeout: float = 10.0) -> subprocess.Popen[bytes]:
    """Attach slirp4netns to the network namespace of ``pid``; returns it once the namespace
    is configured. It joins the sandbox's cgroups first thing. The caller reaps it."""
    ready_r, ready_w = os.pipe()
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
                 "--enable-sandbox", "--enable-seccomp", "--exit-fd", str(exit_fd),
                 "--ready-fd", str(ready_w), str(pid), "tap0"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                pass_fds=(exit_fd, ready_w), start_new_session=True)
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


class EgressRules:
    """The egress tables of one data dir's networked sandboxes, and their names kept current.

    What each sandbox asked for is saved in its dir (``egress.json``), so an orchestrator that
    re-adopts sandboxes after a restart refreshes their names too.
    """

    def __init__(self, sandboxes_dir: Path, refresh: float) -> None:
        self.sandboxes_dir = sandboxes_dir
        self.refresh = refresh
        self._applied: dict[str, list[IPNetwork] | None] = {}
        self._task: asyncio.Task[None] | None = None

    def install(self, sandbox_id: str, pid: int, egress: Sequence[str] | None) -> None:
        """Resolve, save and apply a new sandbox's rules in the namespace of ``pid``."""
        allowed = None if egress is None else resolve(egress)
        save_egress(self.sandboxes_dir / sandbox_id, egress)
        apply_rules(pid, allowed)
        self._applied[sandbox_id] = allowed

    def forget(self, sandbox_id: str) -> None:
        self._applied.pop(sandbox_id, None)

    async def refresh_once(self) -> None:
        """Re-resolve the names in every allow-list; apply what changed."""
        for sdir in list(self.sandboxes_dir.iterdir()):
            entries = load_egress(sdir)
            if not entries or all(not isinstance(parse_egress_entry(e), str) for e in entries):
                continue
            allowed = await asyncio.to_thread(resolve, entries)
            if allowed == self._applied.get(sdir.name):
                continue
            try:
                pid = int((sdir / "agent.pid").read_text())  # in the sandbox's namespaces
                await asyncio.to_thread(update_allowed, pid, allowed)
            except (OSError, ValueError, NetworkError) as e:
                log.warning("egress refresh of %s failed: %s", sdir.name, e)
                continue
            self._applied[sdir.name] = allowed

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            try:
                await self.refresh_once()
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.exception("egress refresh pass failed")
