"""The assistant's tools over one user's world: mail, calendar, contacts, files, notes, todos
and a web search over a bundled corpus. Standard library only: it runs inside the sandbox.

The world is a JSON document (see ``orchard/domains/assistant/model.py`` for its shape); each tool
is a function of the world and its arguments, with a JSON schema that both the HTTP API and the
MCP server publish. ``call`` checks the arguments against the schema first, so a wrong call
comes back as an error that quotes the schema, and a tool never sees one.
"""

import copy
import itertools

TOOLS = {}


class ToolError(Exception):
    """A call the tool refused; the message says what to change."""


def tool(description, required=(), **properties):
    """Register a function as a tool whose schema has these properties."""
    def register(fn):
        TOOLS[fn.__name__] = {
            "fn": fn, "description": description,
            "schema": {"type": "object", "properties": properties,
                       "required": list(required), "additionalProperties": False}}
        return fn
    return register


S = {"type": "string"}
LIST = {"type": "array", "items": {"type": "string"}}
BOOL = {"type": "boolean"}
WHEN = {"type": "string", "description": "YYYY-MM-DDTHH:MM"}
DAY = {"type": "string", "description": "YYYY-MM-DD"}


def _next_id(items, prefix):
    taken = {item["id"] for item in items}
    return next(f"{prefix}{n}" for n in itertools.count(len(items) + 1)
                if f"{prefix}{n}" not in taken)


def _find(items, item_id, what):
    for item in items:
        if item["id"] == item_id:
            return item
    raise ToolError(f"no {what} with id {item_id!r}; list them to see the ids")


def _matches(query, *fields):
    words = (query or "").lower().split()
    text = " ".join(str(f) for f in fields).lower()
    return all(w in text for w in words)


# --- mail ----------------------------------------------------------------------------------

def _summary(m):
    return {k: m[k] for k in ("id", "folder", "from", "to", "subject", "date", "read")}


@tool("Search mail by words in sender, recipients, subject or body; newest first.",
      query=S, folder=S, unread_only=BOOL)
def mail_search(world, query="", folder=None, unread_only=False):
    found = [m for m in world["mail"] if (folder is None or m["folder"] == folder)
             and (not unread_only or not m["read"])
             and _matches(query, m["from"], *m["to"], m["subject"], m["body"])]
    return [_summary(m) for m in sorted(found, key=lambda m: m["date"], reverse=True)]


@tool("Read one message (marks it read).", required=["id"], id=S)
def mail_read(world, id):
    message = _find(world["mail"], id, "message")
    message["read"] = True
    return message


@tool("Send a message; it is kept in the 'sent' folder.", required=["to", "subject", "body"],
      to=LIST, subject=S, body=S, cc=LIST, in_reply_to=S)
def mail_send(world, to, subject, body, cc=(), in_reply_to=None):
    if not to:
        raise ToolError("'to' needs at least one address")
    unknown = [a for a in [*to, *cc] if "@" not in a]
    if unknown:
        known = sorted(c["email"] for c in world["contacts"])[:3]
        raise ToolError(f"not email addresses: {unknown}; look names up with contacts_search"
                        f" (known addresses include {known})")
    if in_reply_to is not None:
        _find(world["mail"], in_reply_to, "message")
    message = {"id": _next_id(world["mail"], "m"), "folder": "sent",
               "from": world["user"]["email"], "to": list(to), "cc": list(cc),
               "subject": subject, "body": body, "date": world["user"]["now"], "read": True,
               "in_reply_to": in_reply_to}
    world["mail"].append(message)
    return {"id": message["id"]}


@tool("Move a message to a folder (inbox, archive, trash or any name).",
      required=["id", "folder"], id=S, folder=S)
def mail_move(world, id, folder):
    _find(world["mail"], id, "message")["folder"] = folder
    return {"id": id, "folder": folder}


# --- calendar ------------------------------------------------------------------------------

def _conflicts(world, event):
    return [e["id"] for e in world["events"] if e["id"] != event["id"]
            and e["start"] < event["end"] and event["start"] < e["end"]]


@tool("Events that overlap [start_day, end_day] (whole days, inclusive), by start.",
      start_day=DAY, end_day=DAY)
def calendar_list(world, start_day="0000-00-00", end_day="9999-99-99"):
    return sorted((e for e in world["events"]
                   if e["start"][:10] <= end_day and e["end"][:10] >= start_day),
                  key=lambda e: e["start"])


def _checked(event):
    if not event["start"] < event["end"]:
        raise ToolError(f"an event must end after it starts ({event['start']} - "
                        f"{event['end']})")
    return event


@tool("Create an event; the answer lists the events it overlaps.",
      required=["title", "start", "end"], title=S, start=WHEN, end=WHEN, attendees=LIST,
      location=S)
def calendar_create(world, title, start, end, attendees=(), location=""):
    event = _checked({"id": _next_id(world["events"], "e"), "title": title, "start": start,
                      "end": end, "attendees": list(attendees), "location": location})
    world["events"].append(event)
    return {"id": event["id"], "conflicts": _conflicts(world, event)}


@tool("Change an event's fields; the answer lists the events it now overlaps.",
      required=["id"], id=S, title=S, start=WHEN, end=WHEN, attendees=LIST, location=S)
def calendar_update(world, id, **changes):
    event = _find(world["events"], id, "event")
    updated = _checked({**event, **changes})
    event.update(updated)
    return {"id": id, "conflicts": _conflicts(world, event)}


@tool("Cancel (delete) an event.", required=["id"], id=S)
def calendar_cancel(world, id):
    world["events"].remove(_find(world["events"], id, "event"))
    return {"id": id, "cancelled": True}


@tool("Invitations waiting for an answer.")
def calendar_invitations(world):
    return [i for i in world["invitations"] if i["status"] == "pending"]


@tool("Accept (adds the event) or decline an invitation.", required=["id", "response"],
      id=S, response={"type": "string", "enum": ["accept", "decline"]})
def calendar_respond(world, id, response):
    invitation = _find(world["invitations"], id, "invitation")
    if invitation["status"] != "pending":
        raise ToolError(f"invitation {id} was already answered: {invitation['status']}")
    invitation["status"] = "accepted" if response == "accept" else "declined"
    if response == "accept":
        return calendar_create(world, **invitation["event"])
    return {"id": id, "status": invitation["status"]}


# --- contacts, files, notes, todos -----------------------------------------------------------

@tool("Find contacts by name, email, company or phone.", query=S)
def contacts_search(world, query=""):
    return [c for c in world["contacts"] if _matches(query, *c.values())]


@tool("Files whose path starts with prefix.", prefix=S)
def files_list(world, prefix="/"):
    return sorted(p for p in world["files"] if p.startswith(prefix))


@tool("A file's text.", required=["path"], path=S)
def files_read(world, path):
    if path not in world["files"]:
        raise ToolError(f"no file {path!r}; files_list shows what there is")
    return world["files"][path]


@tool("Write a file (replaces one that is there).", required=["path", "content"], path=S,
      content=S)
def files_write(world, path, content):
    if not path.startswith("/"):
        raise ToolError(f"paths are absolute: '/{path}', not {path!r}")
    world["files"][path] = content
    return {"path": path, "bytes": len(content.encode())}


@tool("Notes whose title or text has every word of query.", query=S)
def notes_search(world, query=""):
    return [n for n in world["notes"] if _matches(query, n["title"], n["body"])]


@tool("Add a note.", required=["title", "body"], title=S, body=S)
def notes_add(world, title, body):
    note = {"id": _next_id(world["notes"], "n"), "title": title, "body": body}
    world["notes"].append(note)
    return {"id": note["id"]}


@tool("The todo list.", include_done=BOOL)
def todos_list(world, include_done=False):
    return [t for t in world["todos"] if include_done or not t["done"]]


@tool("Add a todo.", required=["text"], text=S, due=DAY)
def todos_add(world, text, due=None):
    todo = {"id": _next_id(world["todos"], "t"), "text": text, "due": due, "done": False}
    world["todos"].append(todo)
    return {"id": todo["id"]}


@tool("Mark a todo done.", required=["id"], id=S)
def todos_done(world, id):
    _find(world["todos"], id, "todo")["done"] = True
    return {"id": id, "done": True}


# --- web search over the bundled corpus --------------------------------------------------------

@tool("Search the web; the five best pages with a snippet each.", required=["query"], query=S)
def web_search(world, query):
    words = query.lower().split()
    scored = sorted(((sum(p["text"].lower().count(w) + 3 * p["title"].lower().count(w)
                          for w in words), p) for p in world["web"]), key=lambda s: -s[0])
    return [{"url": p["url"], "title": p["title"], "snippet": p["text"][:160]}
            for score, p in scored[:5] if score > 0]


@tool("A web page's text.", required=["url"], url=S)
def web_open(world, url):
    for page in world["web"]:
        if page["url"] == url:
            return {"url": url, "title": page["title"], "text": page["text"]}
    raise ToolError(f"no page at {url}; web_search finds pages")


# --- calls ---------------------------------------------------------------------------------

_TYPES = {"string": str, "boolean": bool, "array": list, "integer": int, "object": dict}


def check_arguments(name, args):
    """Why ``args`` do not fit the tool's schema, or None."""
    schema = TOOLS[name]["schema"]
    if not isinstance(args, dict):
        return "the arguments must be a JSON object"
    missing = [k for k in schema["required"] if k not in args]
    if missing:
        return f"missing {missing}"
    for key, value in args.items():
        spec = schema["properties"].get(key)
        if spec is None:
            return f"no argument {key!r} (it takes {sorted(schema['properties'])})"
        if not isinstance(value, _TYPES[spec["type"]]) or (
                spec["type"] == "array" and not all(isinstance(v, str) for v in value)):
            return f"{key!r} must be a JSON {spec['type']}, not {value!r}"
        if "enum" in spec and value not in spec["enum"]:
            return f"{key!r} must be one of {spec['enum']}, not {value!r}"
    return None


def call(world, name, args):
    """Run a tool; a new world and its result. The world given is left as it was when the
    tool refuses, so a refused call changes nothing."""
    if name not in TOOLS:
        raise ToolError(f"no tool {name!r}; the tools: {sorted(TOOLS)}")
    wrong = check_arguments(name, args)
    if wrong:
        raise ToolError(f"{name}: {wrong}. Its schema: {TOOLS[name]['schema']}")
    changed = copy.deepcopy(world)
    return changed, TOOLS[name]["fn"](changed, **args)
