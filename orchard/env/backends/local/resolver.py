"""The DNS resolver of a sandbox with an egress allow-list: it answers for the listed names only.

Such a sandbox may not reach slirp4netns's DNS forwarder (its rules refuse it): a forwarder
would carry any name out to the host's resolvers (a tunnel: the data rides in the name) and
resolve the private network's names for it. Instead the orchestrator binds a UDP socket at
127.0.0.1:53 inside the sandbox's network namespace, before any sandbox code runs (see
``network.EgressRules``), and answers on it from its own event loop:

- A and AAAA for a listed name: the addresses the host resolved for it, which are the ones its
  rules allow (both come from one resolution, kept fresh by ``EgressRules``);
- NOERROR with no records for a listed name's other types, SERVFAIL for a listed name the host
  could not resolve (yet), NXDOMAIN for every other name.

It never asks another server. Queries come from sandbox code, so none is trusted: one over
``MAX_QUERY`` bytes, or past the sandbox's budget of ``RATE`` a second, is dropped unread, and
what is not a well-formed query gets no answer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
ADDRESS = "127.0.0.1"  # where a sandbox's resolver listens, in its own network namespace
MAX_QUERY = 512  # bytes: a query for the longest name, with EDNS, is well under this
# Records per answer: 8 of them fit one 512-byte UDP reply even for the longest name, so no
# reply is truncated (there is no TCP to retry on). The rules allow every address anyway.
MAX_ANSWERS = 8
RATE, BURST = 200.0, 400.0  # queries a second per sandbox, sustained and at once

Names = Mapping[str, Sequence[IPAddress]]


class AllowListResolver(asyncio.DatagramProtocol):
    """Answers one sandbox's queries from ``names`` (listed name -> addresses the host
    resolved; replace the mapping to update it)."""

    def __init__(self, names: Names, ttl: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.names = names
        self.ttl = ttl
        self._clock = clock
        self._tokens, self._last = BURST, clock()
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's datagram transports do not subclass asyncio's, so no isinstance check.
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        if len(data) > MAX_QUERY or not self._spend():
            return
        reply = self.answer(data)
        if reply is not None and self._transport is not None:
            self._transport.sendto(reply, addr)

    def error_received(self, exc: Exception) -> None:
        """An ICMP error for an earlier reply (its asker went away): nothing to do."""

    def _spend(self) -> bool:
        """One query's worth of the sandbox's budget, if it has that much left."""
        now = self._clock()
        self._tokens = min(BURST, self._tokens + (now - self._last) * RATE)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def answer(self, wire: bytes) -> bytes | None:
        """The reply to one query, or None for what is not one."""
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return None
        if query.flags & dns.flags.QR:  # a response: answering it could start a loop
            return None
        response = dns.message.make_response(query)
        if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
            response.set_rcode(dns.rcode.REFUSED)
            return response.to_wire()
        question = query.question[0]
        addresses = self.names.get(question.name.to_text(omit_final_dot=True).lower())
        if addresses is None or question.rdclass != dns.rdataclass.IN:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif not addresses:
            response.set_rcode(dns.rcode.SERVFAIL)
        elif question.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            version = 4 if question.rdtype == dns.rdatatype.A else 6
            found = [str(a) for a in addresses if a.version == version][:MAX_ANSWERS]
            if found:
                response.answer.append(dns.rrset.from_text_list(
                    question.name, self.ttl, dns.rdataclass.IN, question.rdtype, found))
        return response.to_wire()
