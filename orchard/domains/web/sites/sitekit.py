"""What every self-hosted site shares: an HTTP server over one JSON state file.

The sites run inside a sandbox under its own Python (standard library only; they import nothing
of orchard), one process per site: ``python3 SITE.py --port N --state FILE``. Every change is
written to the state file at once (atomically), which is what a task's checker reads. The
pages are plain HTML with real forms and links, so a browser agent works them like any site.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

STYLE = ("body{font-family:sans-serif;max-width:900px;margin:1em auto}"
         "nav a{margin-right:1em}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:4px 8px}.msg{color:#060}")


def esc(text: object) -> str:
    return html.escape(str(text))


def page(title: str, body: str, nav: str = "") -> str:
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{esc(title)}</title>"
            f"<style>{STYLE}</style></head><body><nav>{nav}</nav><main><h1>{esc(title)}</h1>"
            f"{body}</main></body></html>")


class Redirect(Exception):
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


class NotFound(Exception):
    pass


class Site:
    """Routes (method, path) to handlers; a handler gets (site, query or form) and returns
    an HTML page, or raises Redirect/NotFound. ``state`` is saved after every POST."""

    def __init__(self, state_path: str, seed: dict) -> None:
        self.state_path = state_path
        self.lock = threading.Lock()
        if os.path.exists(state_path):
            with open(state_path) as f:
                self.state = json.load(f)
        else:
            self.state = json.loads(json.dumps(seed))
            self.save()
        self.routes: dict = {}

    def route(self, method: str, path: str):
        def register(fn):
            self.routes[(method, path)] = fn
            return fn
        return register

    def save(self) -> None:
        tmp = f"{self.state_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=1, sort_keys=True)
        os.replace(tmp, self.state_path)

    def handle(self, method: str, path: str, params: dict) -> tuple[int, str, str | None]:
        handler = self.routes.get((method, path))
        if handler is None:
            return 404, page("Not found", f"<p>No page {esc(path)}.</p>"), None
        with self.lock:
            try:
                body = handler(self, params)
            except Redirect as r:
                if method == "POST":
                    self.save()
                return 303, "", r.location
            except NotFound as e:
                return 404, page("Not found", f"<p>{esc(e)}</p>"), None
            if method == "POST":
                self.save()
        return 200, body, None


def _handler(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            params = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if method == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                form = self.rfile.read(length).decode()
                params.update({k: v[-1] for k, v in parse_qs(form,
                                                             keep_blank_values=True).items()})
            status, body, location = site.handle(method, url.path, params)
            data = body.encode()
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def log_message(self, *args: object) -> None:
            pass  # the sandbox's event log is the record, not stderr

    return Handler


def main(site_factory) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    args = parser.parse_args()
    site = site_factory(args.state)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(site))
    server.serve_forever()
