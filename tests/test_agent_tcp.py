"""The agent protocol over TCP (what the Kubernetes backend dials at Pod IPs), with a token."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env.agent.client import AgentClient, AgentError, AgentUnreachable
from orchard.env.agent.server import boot as agent_boot
from tests.conftest import free_port, wait_until


@pytest.fixture(params=["file", "env"])
def tcp_agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The agent as a pod runs it: on TCP with a token, from a file or (as on Kubernetes) from
    an environment variable."""
    token = "s3cret-token"
    (tmp_path / "token").write_text(token + "\n")
    port = free_port()
    source = (["--token-file", str(tmp_path / "token")] if request.param == "file"
              else ["--token-env", "ORCHARD_AGENT_TOKEN"])
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", agent_boot.__file__, "--tcp", f"127.0.0.1:{port}",
         *source],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin",
             **({"ORCHARD_AGENT_TOKEN": token} if request.param == "env" else {})},
    )

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    assert wait_until(listening, interval=0.02), f"the agent never listened on port {port}"
    yield f"tcp:127.0.0.1:{port}", token
    proc.kill()
    proc.wait()


async def test_exec_and_files_over_tcp(tcp_agent: tuple[str, str]) -> None:
    address, token = tcp_agent
    client = AgentClient(address, token=token)
    try:
        result = await client.exec({"argv": ["echo", "over tcp"], "cwd": "/"})
        assert result["stdout"] == "over tcp\n" and result["exit_code"] == 0
        health = await client.health()
        assert health["status"] == "ok"
    finally:
        await client.close()


async def test_wrong_token_is_refused(tcp_agent: tuple[str, str]) -> None:
    address, _ = tcp_agent
    for token in (None, "wrong"):
        client = AgentClient(address, token=token)
        try:
            with pytest.raises(AgentError) as err:
                await client.exec({"argv": ["true"], "cwd": "/"})
            assert err.value.status == 401 and "X-Agent-Token" in err.value.detail
        finally:
            await client.close()


async def test_unreachable_agent_says_so() -> None:
    client = AgentClient(f"tcp:127.0.0.1:{free_port()}")
    try:
        with pytest.raises(AgentUnreachable) as err:
            await client.health()
        assert "unreachable" in err.value.detail
    finally:
        await client.close()


async def test_token_is_not_inherited_by_commands(tcp_agent: tuple[str, str]) -> None:
    address, token = tcp_agent
    client = AgentClient(address, token=token)
    try:
        result = await client.exec({"command": "env", "cwd": "/"})
        assert result["exit_code"] == 0 and token not in result["stdout"]
    finally:
        await client.close()


async def test_health_answers_probes_without_the_token(tcp_agent: tuple[str, str]) -> None:
    address, _ = tcp_agent
    client = AgentClient(address)  # a kubelet probe carries no secret
    try:
        assert await client.health() == {"status": "ok"}  # and learns nothing else
        with pytest.raises(AgentError) as err:
            await client.processes()
        assert err.value.status == 401
    finally:
        await client.close()


async def test_stale_fencing_token_is_refused(tcp_agent: tuple[str, str]) -> None:
    address, token = tcp_agent
    client = AgentClient(address, token=token)
    try:
        req = {"argv": ["true"], "cwd": "/"}
        assert (await client.exec(req, fence=5))["exit_code"] == 0
        assert (await client.exec(req, fence=5))["exit_code"] == 0  # the same holder again
        with pytest.raises(AgentError) as err:
            await client.exec(req, fence=4)  # a holder whose lock expired and was re-granted
        assert err.value.status == 409 and "stale fencing token 4" in err.value.detail
        assert (await client.exec(req, fence=6))["exit_code"] == 0
    finally:
        await client.close()
