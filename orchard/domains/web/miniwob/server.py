"""The MiniWoB++ site, run inside the sandbox: the vendored task pages, one episode per load.

Standard library only: it is uploaded into the sandbox and runs on the sandbox's Python, like the
bundled sites. A task page (``/miniwob/<task>.html?seed=S&limit=MS&mode=M``) is served with one
script added before ``</body>``. That script does what upstream's Python environment does
through Selenium: once the page has loaded it seeds ``Math.seedrandom`` with the seed, sets the
data mode and ``core.EPISODE_MAX_TIME``, and calls ``core.startEpisodeReal()`` (so there is no
START overlay to click). It then reports to ``POST /episode``: the instruction (``#query``) when
the episode starts, and the page's own ``WOB_REWARD_GLOBAL``, ``WOB_RAW_REWARD_GLOBAL`` and
``WOB_REWARD_REASON`` when ``core.endEpisode`` ends it (a click that solves it, a wrong one, or
the page's timer). The report is a synchronous request, so the state file holds the reward
before the action that ended the episode returns. Each report is written to the state file at
once; that file is what the checker reads.

One episode per server: the first end is final (the page then shows DONE and its overlay takes
no clicks), and a reload does not start a second problem's score.
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

INJECT = """<script>
(function () {
  var q = core.QueryString, seed = q.seed, reported = false;
  var limit = q.limit ? Number(q.limit) : core.EPISODE_MAX_TIME;
  function report(body) {
    var r = new XMLHttpRequest();
    r.open('POST', '/episode', false);  // synchronous: the reward is stored before we return
    r.setRequestHeader('Content-Type', 'application/json');
    r.send(JSON.stringify(body));
  }
  var end = core.endEpisode;
  core.endEpisode = function () {
    end.apply(this, arguments);
    if (!WOB_DONE_GLOBAL || reported) return;
    reported = true;
    core.cover_div.onclick = null;  // one episode: no second problem after this one
    core.cover_div.innerHTML = 'DONE';
    report({event: 'end', reward: WOB_REWARD_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,
            reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON)});
  };
  window.addEventListener('load', function () {
    // As upstream's environment: seed (a number stays a number), mode, time, then start.
    if (seed !== undefined) Math.seedrandom(/^-?[0-9]+$/.test(seed) ? Number(seed) : seed);
    if (q.mode) core.setDataMode(q.mode);
    core.EPISODE_MAX_TIME = limit;
    core.startEpisodeReal();
    core.hideDisplay();  // upstream's observations leave the reward display out too
    report({event: 'start', page: location.pathname, seed: seed === undefined ? null : seed,
            mode: WOB_DATA_MODE, time_limit_ms: limit, instruction: core.getUtterance()});
  });
})();
</script>
"""

EMPTY = {"page": None, "seed": None, "mode": None, "time_limit_ms": None, "instruction": None,
         "started": False, "loads": 0, "done": False, "reward": None, "raw_reward": None,
         "reason": None}


class Episode:
    """The state of the one episode, written through to a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = dict(EMPTY)
        self.lock = threading.Lock()  # the server answers each request on its own thread
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)

    def record(self, event: dict) -> None:
        with self.lock:
            self._record(event)

    def _record(self, event: dict) -> None:
        if event.get("event") == "start":
            self.state["loads"] += 1
            if not self.state["started"]:  # a reload keeps the first start's record
                self.state.update(started=True, **{k: event.get(k) for k in (
                    "page", "seed", "mode", "time_limit_ms", "instruction")})
        elif event.get("event") == "end" and self.state["started"] and not self.state["done"]:
            self.state.update(done=True, reward=event.get("reward"),
                              raw_reward=event.get("raw_reward"), reason=event.get("reason"))
        self.save()


def make_handler(root: Path, episode: Episode) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: the page fetches many files
            pass

        def send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            path = urlsplit(self.path).path
            if path == "/":
                names = sorted(p.stem for p in (root / "miniwob").glob("*.html"))
                links = "".join(f'<li><a href="/miniwob/{n}.html">{n}</a></li>' for n in names)
                return self.send(200, f"<h1>MiniWoB++</h1><ul>{links}</ul>".encode(),
                                 "text/html; charset=utf-8")
            file = (root / path.lstrip("/")).resolve()
            if not file.is_relative_to(root) or not file.is_file():
                return self.send(404, b"not found", "text/plain")
            body = file.read_bytes()
            if file.parent == root / "miniwob" and file.suffix == ".html":
                text = body.decode("utf-8")
                at = text.rfind("</body>")
                body = (text[:at] + INJECT + text[at:]).encode("utf-8")
            kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
            self.send(200, body, kind + ("; charset=utf-8" if kind.startswith("text/") or
                                         kind.endswith("javascript") else ""))

        def do_POST(self) -> None:  # noqa: N802
            if urlsplit(self.path).path != "/episode":
                return self.send(404, b"not found", "text/plain")
            try:
                event = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)))
            except ValueError:
                return self.send(400, b"a JSON episode event, please", "text/plain")
            episode.record(event if isinstance(event, dict) else {})
            self.send(200, b"{}", "application/json")

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--root", type=Path, required=True, help="the vendored pages")
    args = parser.parse_args()
    args.state.parent.mkdir(parents=True, exist_ok=True)
    episode = Episode(args.state)
    server = ThreadingHTTPServer(("127.0.0.1", args.port),
                                 make_handler(args.root.resolve(), episode))
    server.serve_forever()


if __name__ == "__main__":
    main()
