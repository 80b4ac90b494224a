"""The PTY WebSocket: a client's terminal bridged to a PTY session in the sandbox's agent.

Two framings share one endpoint, told apart by the ``command`` query parameter:

- ours (``?command=bash&cols=80&rows=24``): binary frames carry terminal bytes both ways, a
  text frame ``{"resize": [cols, rows]}`` resizes, and the server's last text frame is
  ``{"exit_code": N}``;
- the reference system's (no ``command``): every frame is JSON text. The client opens with
  ``{"type": "init", "cmd": [...], "env", "cwd", "rows", "cols", "login_shell"}`` and then
  sends ``stdin`` (base64 ``data``), ``resize``, ``signal`` (``sig``) and ``close``; the server
  answers ``ready`` (``pid``), ``stdout`` (base64 ``data``), then ``exit`` (``code``) or
  ``error`` (``message``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shlex
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect

from orchard.env.agent.client import PtyChannel
from orchard.env.auth import check_key, websocket_key
from orchard.env.errors import BadRequest, ServiceError
from orchard.env.service import SandboxOps

INIT_TIMEOUT = 30.0  # how long a reference-framing client may take to send its init frame


async def serve_pty(ws: WebSocket, ops: SandboxOps, sid: str, api_keys: list[str]) -> None:
    query = ws.query_params
    key, subprotocol = websocket_key(ws)
    reference = "command" not in query
    try:
        check_key(api_keys, key)
        await ops.agent(sid)  # refused before the handshake: no such sandbox, not up
    except ServiceError as e:
        return await _refuse(ws, e, subprotocol, reference)
    # Accept first: a close before accept is an HTTP 403 that loses code and reason.
    await ws.accept(subprotocol=subprotocol)
    try:
        if reference:
            init = await _init_frame(ws)
            channel = await ops.open_pty(
                sid, _reference_argv(init), int(init.get("cols") or 80),
                int(init.get("rows") or 24), env=init.get("env") or {}, cwd=init.get("cwd"))
        else:
            command = query["command"]
            argv = ["/bin/sh", "-c", f"exec {command}"] if " " in command else [command]
            channel = await ops.open_pty(sid, argv, int(query.get("cols", 80)),
                                         int(query.get("rows", 24)))
    except (ServiceError, ValueError) as e:
        return await _close_with(ws, str(e), reference)
    except WebSocketDisconnect:
        return
    if reference:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await ws.send_text(json.dumps({"type": "ready", "pid": channel.pid}))
    await _bridge(ws, channel, reference)


async def _refuse(ws: WebSocket, e: ServiceError, subprotocol: str | None,
                  reference: bool) -> None:
    await ws.accept(subprotocol=subprotocol)
    await _close_with(ws, e.detail, reference)


async def _close_with(ws: WebSocket, message: str, reference: bool) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        if reference:
            await ws.send_text(json.dumps({"type": "error", "message": message}))
        await ws.close(code=1008, reason=message.encode()[:120].decode(errors="ignore"))


async def _init_frame(ws: WebSocket) -> dict[str, Any]:
    try:
        text = await asyncio.wait_for(ws.receive_text(), INIT_TIMEOUT)
        init = json.loads(text)
    except TimeoutError:
        raise BadRequest(f"no init frame within {INIT_TIMEOUT:g}s: send "
                         '{"type": "init", "cmd": [...]} first') from None
    except (ValueError, KeyError) as e:
        raise BadRequest(f"the first frame must be a JSON init frame: {e}") from None
    if not isinstance(init, dict) or init.get("type") != "init":
        raise BadRequest('the first frame must be {"type": "init", "cmd": [...], ...}; or pass '
                         "?command= for binary frames")
    return init


def _reference_argv(init: dict[str, Any]) -> list[str]:
    cmd = init.get("cmd") or ["/bin/sh"]
    if isinstance(cmd, str):
        cmd = ["/bin/sh", "-c", cmd]
    if not isinstance(cmd, list) or not all(isinstance(a, str) for a in cmd):
        raise BadRequest("'cmd' in the init frame must be a list of strings")
    if init.get("login_shell"):
        return ["/bin/bash", "-l", "-c", shlex.join(cmd)]
    return cmd


async def _bridge(ws: WebSocket, channel: PtyChannel, reference: bool) -> None:
    pump = asyncio.create_task(_from_client(ws, channel, reference))
    try:
        while True:
            kind, payload = await channel.recv()
            if kind == "data":
                if reference:
                    await ws.send_text(json.dumps(
                        {"type": "stdout", "data": base64.b64encode(payload).decode()}))
                else:
                    await ws.send_bytes(payload)
                continue
            if kind == "exit":
                code = int(payload)
                await ws.send_text(json.dumps({"type": "exit", "code": code} if reference
                                              else {"exit_code": code}))
            break
        await ws.close()
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        pump.cancel()
        await channel.close()


async def _from_client(ws: WebSocket, channel: PtyChannel, reference: bool) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                break
            if msg.get("bytes") is not None:
                await channel.send(msg["bytes"])
            elif msg.get("text"):
                try:
                    frame = json.loads(msg["text"])
                except ValueError:
                    continue  # not a control frame: ignored, as the reference does
                if not isinstance(frame, dict):
                    continue
                if reference and await _reference_frame(channel, frame):
                    break
                if not reference and frame.get("resize"):
                    cols, rows = frame["resize"]
                    await channel.resize(int(cols), int(rows))
    await channel.close()


async def _reference_frame(channel: PtyChannel, frame: dict[str, Any]) -> bool:
    """Act on one client frame; True when the client is done."""
    kind = frame.get("type")
    if kind == "stdin":
        data = frame.get("data", "")
        await channel.send(base64.b64decode(data) if isinstance(data, str) else b"")
    elif kind == "resize":
        await channel.resize(int(frame.get("cols", 80)), int(frame.get("rows", 24)))
    elif kind == "signal":
        await channel.signal(str(frame.get("sig", "TERM")))
    elif kind == "close":
        return True
    return False
