"""Loaded by every Python process a test starts with this folder on PYTHONPATH (and so by
their Python children): refuses, and records in ``$NET_GUARD_LOG``, every name lookup and
connection that is not to loopback, so a test can assert that nothing reached further."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

LOG = os.environ.get("NET_GUARD_LOG")


def _loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def _guard(event: str, args: tuple) -> None:
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event == "socket.connect" and args[0].family in (socket.AF_INET, socket.AF_INET6):
        host = args[1][0]
    else:
        return
    if not _loopback(host):
        with open(LOG, "a") as log:  # type: ignore[arg-type]
            log.write(f"{event} {host!r} pid={os.getpid()} argv={sys.argv[:3]}\n")
        raise OSError(f"network guard: {event} to {host!r} refused (the test allows loopback)")


if LOG:
    sys.addaudithook(_guard)
