"""The assistant's services in the sandbox: the tools of ``tools.py`` over one world, as a plain
HTTP API and as an MCP server (streamable HTTP, JSON answers). Standard library only.

    python3 server.py --port 8200 --state /workspace/.orchard-assistant/world.json

    GET  /tools          the tools: name, description, input_schema
    POST /tools/{name}   call one with a JSON object of arguments: 200 {"result": ...}, or
                         400 {"error": "..."} (the world is unchanged)
    GET  /state          the world as it is now (what a checker grades)
    POST /mcp            MCP: initialize, tools/list, tools/call, ping

Every change is written to the state file before the answer, so the world survives the
server and a snapshot of the sandbox keeps it.
"""

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tools import TOOLS, ToolError, call

PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")


class World:
    def __init__(self, path):
        self.path = path
        with open(path) as f:
            self.state = json.load(f)
        self.lock = threading.Lock()

    def call(self, name, args):
        with self.lock:
            changed, result = call(self.state, name, args)
            if changed != self.state:
                tmp = f"{self.path}.tmp"
                with open(tmp, "w") as f:
                    json.dump(changed, f, indent=1)
                os.replace(tmp, self.path)
                self.state = changed
            return result


def listing():
    return [{"name": name, "description": t["description"], "inputSchema": t["schema"]}
            for name, t in TOOLS.items()]


def mcp(world, message):
    """The answer to one JSON-RPC message, or None for a notification."""
    method, params, mid = message.get("method"), message.get("params") or {}, message.get("id")
    if mid is None:
        return None
    if method == "initialize":
        asked = params.get("protocolVersion")
        result = {"protocolVersion": asked if asked in PROTOCOL_VERSIONS
                  else PROTOCOL_VERSIONS[0],
                  "capabilities": {"tools": {"listChanged": False}},
                  "serverInfo": {"name": "orchard-assistant", "version": "1"}}
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": listing()}
    elif method == "tools/call":
        try:
            value = world.call(params.get("name"), params.get("arguments") or {})
            result = {"content": [{"type": "text", "text": json.dumps(value)}],
                      "isError": False}
        except ToolError as e:  # the model's to read and fix, not a protocol error
            result = {"content": [{"type": "text", "text": str(e)}], "isError": True}
    else:
        return {"jsonrpc": "2.0", "id": mid,
                "error": {"code": -32601, "message": f"no method {method!r}"}}
    return {"jsonrpc": "2.0", "id": mid, "result": result}


class Handler(BaseHTTPRequestHandler):
    world = None

    def log_message(self, *args):
        pass

    def _send(self, status, payload=None):
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self):
        try:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))
                              or b"{}")
        except ValueError as e:
            raise ToolError(f"the body is not JSON: {e}") from None

    def do_GET(self):
        if self.path == "/tools":
            self._send(200, listing())
        elif self.path == "/state":
            self._send(200, self.world.state)
        elif self.path == "/mcp":  # no server-initiated stream
            self._send(405, {"error": "POST JSON-RPC messages to /mcp"})
        else:
            self._send(404, {"error": f"no {self.path}; see GET /tools"})

    def do_POST(self):
        try:
            body = self._json()
        except ToolError as e:
            return self._send(400, {"error": str(e)})
        if self.path == "/mcp":
            messages = body if isinstance(body, list) else [body]
            answers = [a for a in (mcp(self.world, m) for m in messages) if a is not None]
            if not answers:
                return self._send(202)
            return self._send(200, answers if isinstance(body, list) else answers[0])
        if not self.path.startswith("/tools/"):
            return self._send(404, {"error": f"no {self.path}; see GET /tools"})
        try:
            self._send(200, {"result": self.world.call(self.path[len("/tools/"):], body)})
        except ToolError as e:
            self._send(400, {"error": str(e)})

    def do_DELETE(self):  # an MCP client ending its session: there is none to end
        self._send(200 if self.path == "/mcp" else 404, {})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    args = parser.parse_args()
    Handler.world = World(args.state)
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
