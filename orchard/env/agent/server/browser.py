"""A headless Chromium in the sandbox, driven over the DevTools protocol on a pipe.

It starts on the first /browser request, and again whenever it has died. Chromium is the
agent's child, so it runs inside the sandbox's cgroups, namespaces and limits. The protocol
travels on fds 3 and 4 (--remote-debugging-pipe) as JSON messages ended by NUL. So no
WebSocket client and no driver process (Playwright's node) is needed, and this module stays
standard library only, like the rest of the agent.

An observation is the page's accessibility tree as lines ``[id] role "name"``, where ``id``
names an element for the next action (renumbered by every observation), with the URL, the
title, the open tabs and, when asked, a PNG screenshot with each element's id drawn on it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

from .common import HTTPError
from .devtools import VIEWPORT, BrowserGone, DevTools, find_chromium

MAX_TREE_CHARS = 24000
# Structure a reader does not act on: its children show one level up. A list's bullets and
# its items' wrappers were a third of a shop page's lines.
SKIP_ROLES = {"none", "generic", "InlineTextBox", "LineBreak", "RootWebArea", "paragraph",
              "Section", "group", "LabelText", "ListMarker", "listitem"}
# After these, a navigation may begin a moment later: wait that long for one to start.
# Aiming waits up to STEADY_TRIES frames for a scrolling page to stop.
FRAME, STEADY_TRIES = 0.03, 30
MAY_NAVIGATE = {"click", "dblclick", "press", "back", "forward"}
VERBS = "observe, goto, click, dblclick, hover, focus, type, select, scroll, press, back, " \
    "forward, tab"

KEYS = {"Enter": 13, "Tab": 9, "Escape": 27, "Backspace": 8, "Delete": 46, "Space": 32,
        "ArrowUp": 38, "ArrowDown": 40, "ArrowLeft": 37, "ArrowRight": 39, "Home": 36,
        "End": 35, "PageUp": 33, "PageDown": 34}
# The protocol's modifier bits; ControlOrMeta is Control, as on Linux.
MODIFIERS = {"Alt": 1, "Control": 2, "ControlOrMeta": 2, "Meta": 4, "Shift": 8}
_MARK = """function(label) {
  const r = this.getBoundingClientRect();
  if (!r.width || !r.height) return;
  const d = document.createElement('div');
  d.className = '__orchard_mark';
  d.style.cssText = `position:fixed;left:${r.left}px;top:${r.top}px;width:${r.width}px;` +
    `height:${r.height}px;border:2px solid #e6194b;z-index:2147483647;pointer-events:none;` +
    'box-sizing:border-box';
  const t = document.createElement('span');
  t.textContent = label;
  t.style.cssText = 'position:absolute;left:0;top:-14px;background:#e6194b;color:#fff;' +
    'font:11px monospace;padding:0 2px';
  d.appendChild(t);
  document.documentElement.appendChild(d);
}"""
_CLEAR = "function(){ if ('value' in this) { this.value = ''; " \
         "this.dispatchEvent(new Event('input', {bubbles: true})); } }"
_SELECT = """function(v) {
  const o = [...(this.options || [])].find(o => o.value === v || o.text.trim() === v);
  if (!o) return false;
  this.value = o.value;
  this.dispatchEvent(new Event('input', {bubbles: true}));
  this.dispatchEvent(new Event('change', {bubbles: true}));
  return true;
}"""


class StaleElement(Exception):
    """The id is not on the page any more: an observation for the model, not a failure."""


class StillLoading(Exception):
    """The page did not finish loading within the action's timeout (an observation too)."""


def _quote(text):
    # Readable for the model: "café", not "caf\u00e9".
    return json.dumps(text, ensure_ascii=False)


def _modifiers(combo):
    """'Control+Shift+a' -> (the protocol's modifier bits, 'a'); the key '+' is written last
    ('Shift++'). A name that is not a modifier is a 400 that lists them."""
    head, plus, key = combo.rpartition("+")
    if plus and not key:  # it ends with '+': that is the key
        head, key = head.removesuffix("+"), "+"
    bits = 0
    for name in head.split("+") if head else ():
        if name not in MODIFIERS:
            raise HTTPError(400, f"{name!r} in key {combo!r} is not a modifier; modifiers are "
                            f"{', '.join(MODIFIERS)}, joined to the key by '+'")
        bits |= MODIFIERS[name]
    return bits, key


class Browser:
    """The sandbox's one browser: tabs, the element ids of the last observation, actions."""

    def __init__(self):
        self._tools = None
        self._session = None
        self._sessions = {}  # targetId -> sessionId
        self._elements = {}  # id -> backendDOMNodeId
        self._opened = {}  # targetId -> order of opening
        self.lock = threading.Lock()

    def _ensure(self):
        if self._tools is not None and self._tools.alive():
            return
        if self._tools is not None:
            self._tools.close()
        # A live fork's restored browser is adopted, once; else a fresh one starts.
        tools = DevTools.restored() if self._tools is None else None
        if tools is None:
            tools = DevTools.launch(*find_chromium())
        self._tools, self._sessions, self._elements = tools, {}, {}
        self._opened = {}
        pages = self._pages()
        self._attach(pages[0]["targetId"] if pages else
                     self._tools.call("Target.createTarget", {"url": "about:blank"})["targetId"])

    def _attach(self, target):
        if target not in self._sessions:
            session = self._tools.call("Target.attachToTarget",
                                       {"targetId": target, "flatten": True})["sessionId"]
            self._tools.call("Page.enable", session=session)
            self._sessions[target] = session
        self._tools.call("Target.activateTarget", {"targetId": target})
        self._session, self._elements = self._sessions[target], {}

    def _page(self, method, params=None, timeout=30.0):
        return self._tools.call(method, params, self._session, timeout)

    def act(self, req):
        """Do one action, then observe; an action's failure is part of the observation."""
        with self.lock:
            self._ensure()
            answered = self._tools.answered
            try:
                return self._act(req)
            except BrowserGone:
                if self._tools.answered != answered:
                    raise  # it died during this request
            # It died after the last request, and only now do we know: this one starts anew.
            self._ensure()
            return self._act(req)

    def _act(self, req):
        timeout = float(req.get("timeout") or 30)
        error = None
        action = req.get("action", "observe")
        navigates = action in MAY_NAVIGATE or action == "type" and req.get("submit")
        since = time.monotonic() if navigates else 0.0
        try:
            self._do(action, req, timeout)
            if not self._tools.settle(self._session, timeout, since):
                raise StillLoading(f"the page was still loading after {timeout:g}s")
        except StaleElement as e:
            error = str(e)
        except StillLoading as e:
            error = str(e)
            # Until it is stopped, a hung navigation holds up the observation too.
            with contextlib.suppress(HTTPError, RuntimeError):
                self._page("Page.stopLoading", timeout=5)
        except RuntimeError as e:  # the protocol refused it, e.g. a bad URL
            error = f"{req.get('action')} failed: {e}"
        return self._observe(req, error)

    def _do(self, action, req, timeout):
        if action == "observe":
            return
        if action == "goto":
            try:
                result = self._page("Page.navigate", {"url": str(req["url"])}, timeout)
            except HTTPError as e:
                if e.status != 504 or not self._tools.alive():
                    raise
                # Navigate answers once the server does: one that never does is a slow page.
                raise StillLoading(f"{req['url']} was still loading after {timeout:g}s (its "
                                   "server did not answer)") from None
            if result.get("errorText"):
                raise RuntimeError(f"{req['url']}: {result['errorText']}")
        elif action == "click":
            x, y = self._point(req)
            for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
                self._page("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y,
                                                        "button": "left", "clickCount": 1})
        elif action == "dblclick":
            x, y = self._point(req)
            self._page("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
            # A double click is two clicks, the second counted as such (dblclick fires on it).
            for count in (1, 2):
                for kind in ("mousePressed", "mouseReleased"):
                    self._page("Input.dispatchMouseEvent", {
                        "type": kind, "x": x, "y": y, "button": "left", "clickCount": count})
        elif action == "hover":
            x, y = self._point(req)
            self._page("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        elif action == "focus":
            self._page("DOM.focus", {"backendNodeId": self._node(req)})
        elif action == "type":
            node = self._node(req)
            self._page("DOM.focus", {"backendNodeId": node})
            if req.get("clear", True):
                self._call_on(node, _CLEAR)
            self._page("Input.insertText", {"text": str(req.get("text", ""))})
            if req.get("submit"):
                self._key("Enter")
        elif action == "select":
            if not self._call_on(self._node(req), _SELECT, [str(req.get("value", ""))]):
                raise StaleElement(f"element {req.get('id')} has no option "
                                   f"{req.get('value')!r}")
        elif action == "scroll":
            if "id" in req:
                self._page("DOM.scrollIntoViewIfNeeded", {"backendNodeId": self._node(req)})
            else:
                dy = int(req.get("amount", VIEWPORT[1] * 3 // 4))
                dy = -dy if req.get("direction") == "up" else dy
                self._page("Input.dispatchMouseEvent", {
                    "type": "mouseWheel", "x": VIEWPORT[0] // 2, "y": VIEWPORT[1] // 2,
                    "deltaX": 0, "deltaY": dy})
        elif action == "press":
            self._key(str(req.get("key", "Enter")))
        elif action in ("back", "forward"):
            history = self._page("Page.getNavigationHistory")
            index = history["currentIndex"] + (-1 if action == "back" else 1)
            if 0 <= index < len(history["entries"]):
                self._page("Page.navigateToHistoryEntry",
                           {"entryId": history["entries"][index]["id"]})
        elif action == "tab":
            self._tab(req)
        else:
            raise HTTPError(400, f"unknown browser action {action!r}; one of {VERBS}")

    def _tab(self, req):
        op = req.get("op", "new")
        pages = self._pages()
        if op == "new":
            target = self._tools.call("Target.createTarget",
                                      {"url": str(req.get("url") or "about:blank")})
            self._opened.setdefault(target["targetId"], len(self._opened))
            self._attach(target["targetId"])
            return
        index = int(req.get("index", -1))
        if not -len(pages) <= index < len(pages):
            raise StaleElement(f"there is no tab {index}; there are {len(pages)}")
        if op == "switch":
            self._attach(pages[index]["targetId"])
        elif op == "close":
            self._tools.call("Target.closeTarget", {"targetId": pages[index]["targetId"]})
            self._sessions.pop(pages[index]["targetId"], None)
            rest = [p for p in self._pages() if p["targetId"] != pages[index]["targetId"]]
            if rest:
                self._attach(rest[-1]["targetId"])
            else:
                self._attach(self._tools.call("Target.createTarget",
                                              {"url": "about:blank"})["targetId"])
        else:
            raise HTTPError(400, f"unknown tab op {op!r}; one of new, switch, close")

    def _pages(self):
        """Open tabs, oldest first (the protocol lists them in no stable order)."""
        pages = [t for t in self._tools.call("Target.getTargets")["targetInfos"]
                 if t["type"] == "page"]
        for page in pages:
            self._opened.setdefault(page["targetId"], len(self._opened))
        return sorted(pages, key=lambda p: self._opened[p["targetId"]])

    def _node(self, req):
        if "id" not in req:
            raise HTTPError(400, f"{req.get('action')} needs an element 'id' from the last "
                            "observation")
        try:
            return self._elements[int(req["id"])]
        except (KeyError, ValueError):
            raise StaleElement(f"there is no element {req['id']} in the last observation; "
                               "observe again") from None

    def _point(self, req):
        if "x" in req and "y" in req:
            return float(req["x"]), float(req["y"])
        node = self._node(req)
        # A wheel scroll is animated and may still be moving the page after we measure.
        # Like Playwright, aim only once the element's box has held still for a frame.
        quad = None
        for _ in range(STEADY_TRIES):
            try:
                self._page("DOM.scrollIntoViewIfNeeded", {"backendNodeId": node})
                box = self._page("DOM.getBoxModel", {"backendNodeId": node})["model"]["content"]
            except RuntimeError:
                raise StaleElement(f"element {req['id']} is not on the page any more (or not "
                                   "visible); observe again") from None
            if box == quad:
                break
            quad = box
            time.sleep(FRAME)
        return sum(quad[0::2]) / 4, sum(quad[1::2]) / 4

    def _call_on(self, node, function, args=()):
        try:
            obj = self._page("DOM.resolveNode", {"backendNodeId": node})["object"]["objectId"]
        except RuntimeError:
            raise StaleElement("that element is not on the page any more; observe "
                               "again") from None
        result = self._page("Runtime.callFunctionOn", {
            "objectId": obj, "functionDeclaration": function, "returnByValue": True,
            "arguments": [{"value": a} for a in args]})
        return result.get("result", {}).get("value")

    def _key(self, combo):
        modifiers, key = _modifiers(combo)
        code = KEYS.get(key)
        if modifiers and code is None and len(key) == 1 and key.isalnum():
            # Shortcuts (Control+a) are looked up by the key's code, which a letter has too.
            code = ord(key.upper())
        base = {"key": key, "code": key, "windowsVirtualKeyCode": code or 0}
        text = {"Enter": "\r", "Space": " "}.get(key, key if len(key) == 1 else "")
        down = "keyDown"
        if modifiers:
            base["modifiers"] = modifiers
            if modifiers & ~MODIFIERS["Shift"]:  # a shortcut types nothing
                text, down = "", "rawKeyDown"
        self._page("Input.dispatchKeyEvent", {"type": down, "text": text, **base})
        self._page("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    # --- observation ---------------------------------------------------------------------

    def _observe(self, req, error):
        nodes = self._page("Accessibility.getFullAXTree")["nodes"]
        lines = self._render(nodes)
        tree, truncated = "\n".join(lines), False
        if len(tree) > MAX_TREE_CHARS:
            tree, truncated = tree[:MAX_TREE_CHARS].rsplit("\n", 1)[0], True
        info = self._page("Runtime.evaluate", {
            "expression": "[location.href, document.title]", "returnByValue": True})
        url, title = info["result"].get("value") or ["", ""]
        current = next((t for t, s in self._sessions.items() if s == self._session), None)
        tabs = [{"index": i, "url": p["url"], "title": p["title"],
                 "active": p["targetId"] == current} for i, p in enumerate(self._pages())]
        out = {"url": url, "title": title, "tabs": tabs, "tree": tree, "truncated": truncated,
               "elements": len(self._elements), "error": error}
        if req.get("screenshot"):
            out["screenshot_png_b64"] = self._screenshot(bool(req.get("marks", True)))
        return out

    def _render(self, nodes):
        by_id = {n["nodeId"]: n for n in nodes}
        lines, self._elements = [], {}

        def walk(node, depth, parent_name=("", "")):
            role = (node.get("role") or {}).get("value", "")
            name = str((node.get("name") or {}).get("value", "")).strip()
            # Text that only repeats its element's name says nothing new.
            shown = not node.get("ignored") and role not in SKIP_ROLES and (
                role != "StaticText" or name and name not in parent_name)
            if shown:
                if role == "StaticText":
                    lines.append(f"{'  ' * depth}{_quote(name)}")
                else:
                    line = f"{'  ' * depth}[{len(self._elements) + 1}] {role}"
                    if name:
                        line += f" {_quote(name)}"
                    value = (node.get("value") or {}).get("value")
                    if value not in (None, ""):
                        line += f" value={_quote(str(value))}"
                    for prop in node.get("properties", []):
                        if prop["name"] in ("checked", "selected", "disabled", "expanded") \
                                and prop["value"].get("value") not in (False, "false", None):
                            line += f" {prop['name']}"
                    if "backendDOMNodeId" in node:
                        self._elements[len(self._elements) + 1] = node["backendDOMNodeId"]
                        lines.append(line)
            for child in node.get("childIds", []):
                if child in by_id:
                    value = str((node.get("value") or {}).get("value", ""))
                    walk(by_id[child], depth + (1 if shown else 0),
                         (name, value) if shown else parent_name)

        for root in (n for n in nodes if not n.get("parentId")):
            walk(root, 0)
        return lines

    def _screenshot(self, marks):
        if marks:
            for label, node in self._elements.items():
                with contextlib.suppress(StaleElement, RuntimeError):
                    self._call_on(node, _MARK, [str(label)])
        try:
            shot = self._page("Page.captureScreenshot", {"format": "png"})["data"]
        finally:
            if marks:
                self._page("Runtime.evaluate", {"expression": "document.querySelectorAll("
                                                "'.__orchard_mark').forEach(e => e.remove())"})
        return shot

    def close(self):
        with self.lock:
            if self._tools is not None:
                self._tools.close()
                self._tools = None


BROWSER = Browser()


def browser_action(req):
    return BROWSER.act(req)
