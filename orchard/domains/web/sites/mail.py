"""A webmail: an inbox, messages, folders, compose and send, archive and delete."""

from __future__ import annotations

import sys

from sitekit import NotFound, Redirect, Site, esc, main, page  # beside it: run as a script

INBOX = [
    ("dana@example.org", "Quarterly report", "Hi, the quarterly report is attached. The "
     "revenue grew by 12 percent. Can you reply with your comments? Dana"),
    ("it@example.org", "Password expiry", "Your password expires in 5 days. The helpdesk "
     "number is 555-0142."),
    ("sam@example.org", "Lunch on Friday?", "Shall we have lunch on Friday at 12:30 at the "
     "Green Bowl? Sam"),
    ("news@example.org", "Weekly newsletter", "This week: the office moves to the 4th floor."),
    ("lee@example.org", "Conference travel", "Your flight to Lisbon departs on 14 May at "
     "07:45, booking code QX7T2L. Lee"),
]
SEED = {"me": "you@example.org",
        "messages": [{"id": i + 1, "from": f, "to": "you@example.org", "subject": s, "body": b,
                      "folder": "inbox"} for i, (f, s, b) in enumerate(INBOX)]}
NAV = ('<a href="/">Inbox</a><a href="/folder?name=archive">Archive</a>'
       '<a href="/folder?name=sent">Sent</a><a href="/folder?name=trash">Trash</a>'
       '<a href="/compose">Compose</a>')


def build(state_path: str) -> Site:
    site = Site(state_path, SEED)

    def folder_page(s: Site, name: str) -> str:
        items = [m for m in s.state["messages"] if m["folder"] == name]
        rows = "".join(f'<li><a href="/message?id={m["id"]}">{esc(m["subject"])}</a> from '
                       f'{esc(m["from"])}</li>' for m in items)
        return page(name.title(), f"<ul>{rows}</ul>" if rows else "<p>No messages.</p>", NAV)

    def message_of(s: Site, ident: str) -> dict:
        for m in s.state["messages"]:
            if str(m["id"]) == ident:
                return m
        raise NotFound(f"no message {ident}")

    @site.route("GET", "/")
    def inbox(s: Site, q: dict) -> str:
        return folder_page(s, "inbox")

    @site.route("GET", "/folder")
    def folder(s: Site, q: dict) -> str:
        return folder_page(s, q.get("name", "inbox"))

    @site.route("GET", "/message")
    def message(s: Site, q: dict) -> str:
        m = message_of(s, q.get("id", ""))
        actions = "".join(
            f'<form method="post" action="/move" style="display:inline"><input type="hidden" '
            f'name="id" value="{m["id"]}"><input type="hidden" name="folder" value="{f}">'
            f"<button>{label}</button></form>"
            for f, label in (("archive", "Archive"), ("trash", "Delete")) if m["folder"] != f)
        reply = f'<a href="/compose?reply={m["id"]}">Reply</a>'
        return page(m["subject"], f"<p>From: {esc(m['from'])}<br>To: {esc(m['to'])}</p>"
                    f"<p>{esc(m['body'])}</p><p>{reply} {actions}</p>", NAV)

    @site.route("POST", "/move")
    def move(s: Site, f: dict) -> str:
        m = message_of(s, f.get("id", ""))
        m["folder"] = f.get("folder", m["folder"])
        raise Redirect("/")

    @site.route("GET", "/compose")
    def compose(s: Site, q: dict) -> str:
        to = subject = ""
        if q.get("reply"):
            m = message_of(s, q["reply"])
            to, subject = m["from"], f"Re: {m['subject']}"
        return page("Compose", '<form method="post" action="/send"><p><label>To <input '
                    f'name="to" value="{esc(to)}"></label></p><p><label>Subject <input '
                    f'name="subject" value="{esc(subject)}"></label></p><p><label>Message '
                    '<textarea name="body" rows="6" cols="70"></textarea></label></p>'
                    "<button>Send</button></form>", NAV)

    @site.route("POST", "/send")
    def send(s: Site, f: dict) -> str:
        if "@" not in f.get("to", ""):
            return page("Not sent", "<p>Give an address to send to.</p>", NAV)
        ident = max(m["id"] for m in s.state["messages"]) + 1
        s.state["messages"].append({"id": ident, "from": s.state["me"],
                                    "to": f["to"].strip(), "subject": f.get("subject", ""),
                                    "body": f.get("body", ""), "folder": "sent"})
        raise Redirect("/folder?name=sent")

    return site


if __name__ == "__main__":
    sys.exit(main(build))
