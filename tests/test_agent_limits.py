"""The limits on what the orchestrator reads from an agent let every genuine answer through.

The attacks on them are in tests/attacks/test_agent_responses.py; these are the answers a
genuine agent gives, right at the limits, and the settings that carry them.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env.agent.client import AgentClient, AgentError
from orchard.env.config import Settings
from tests.attacks.test_agent_responses import HEAD, FakeAgent

LIMIT = 1 << 20


def exactly(size: int, key: str = "stdout") -> Iterator[bytes]:
    """A JSON answer of exactly ``size`` bytes."""
    frame = json.dumps({key: ""}).encode()
    body = json.dumps({key: "x" * (size - len(frame))}).encode()
    yield HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body


def chunked(size: int) -> Iterator[bytes]:
    yield HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % size + b"z" * size + b"\r\n0\r\n\r\n"


@pytest.fixture()
def sock() -> Iterator[Path]:
    # pytest's tmp paths can be too long for AF_UNIX; /tmp is not.
    d = Path(tempfile.mkdtemp(prefix="/tmp/orc-limits-"))
    yield d / "agent.sock"
    d.rmdir()


async def test_an_answer_of_exactly_the_limit_is_read_and_one_byte_more_is_not(
        sock: Path) -> None:
    for size, fits in ((LIMIT, True), (LIMIT + 1, False)):
        with FakeAgent(sock, lambda method, path, size=size: exactly(size, "status")):
            client = AgentClient(f"unix:{sock}", max_response_bytes=LIMIT)
            if fits:
                assert len((await client.health())["status"]) > LIMIT - 20
            else:
                with pytest.raises(AgentError, match="agent_max_response_bytes"):
                    await client.health()
            await client.close()


async def test_an_exec_may_answer_what_its_max_output_bytes_lets_it_print(sock: Path) -> None:
    """Two streams of max_output_bytes, JSON-escaped at worst: the cap grows with them."""
    answer = 2 * LIMIT  # over max_response_bytes, within what max_output_bytes allows
    with FakeAgent(sock, lambda method, path: exactly(answer)):
        client = AgentClient(f"unix:{sock}", max_response_bytes=LIMIT)
        result = await client.exec({"command": "x", "max_output_bytes": LIMIT})
        assert len(result["stdout"]) > LIMIT
        with pytest.raises(AgentError, match="agent_max_response_bytes"):
            await client.exec({"command": "x", "max_output_bytes": 1024})
        await client.close()


async def test_a_download_of_exactly_the_limit_goes_through_either_way(sock: Path) -> None:
    """Declared (the genuine agent) or chunked, a file of max_download_bytes is whole."""
    for answer in (exactly(LIMIT), chunked(LIMIT)):
        with FakeAgent(sock, lambda method, path, answer=list(answer): answer):
            client = AgentClient(f"unix:{sock}", max_download_bytes=LIMIT)
            r = await client.open_file("/f")
            assert len(await r.aread()) == LIMIT
            await client.close()


def test_the_settings_give_the_agent_clients_their_limits() -> None:
    limits = Settings(agent_max_response_bytes=5 << 20, max_download_bytes=7 << 20
                      ).agent_limits()
    client = AgentClient("unix:/nowhere", **limits)
    assert (client.max_response_bytes, client.max_download_bytes) == (5 << 20, 7 << 20)
    defaults = Settings().agent_limits()
    # Above every bounded answer of the genuine agent: an exec with the default 10 MiB per
    # stream, escaped at worst, is 120 MiB.
    assert defaults["max_response_bytes"] >= 2 * 6 * (10 << 20)
    assert defaults["max_download_bytes"] == Settings().max_upload_bytes
