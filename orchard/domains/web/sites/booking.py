"""A booking site: rooms with a calendar of slots, a booking form, and cancellations."""

from __future__ import annotations

import sys

from sitekit import NotFound, Redirect, Site, esc, main, page  # beside it: run as a script

ROOMS = {"Aurora": 4, "Borealis": 8, "Cascade": 12}
DAYS = ["2026-03-02", "2026-03-03", "2026-03-04"]
SLOTS = ["09:00", "11:00", "14:00", "16:00"]
SEED = {"rooms": ROOMS, "days": DAYS, "slots": SLOTS,
        "bookings": [{"id": 1, "room": "Borealis", "day": "2026-03-03", "slot": "11:00",
                      "name": "Team Sync", "people": 6}]}
NAV = '<a href="/">Rooms</a><a href="/bookings">My bookings</a>'


def build(state_path: str) -> Site:
    site = Site(state_path, SEED)

    def taken(s: Site, room: str, day: str, slot: str) -> bool:
        return any((b["room"], b["day"], b["slot"]) == (room, day, slot)
                   for b in s.state["bookings"])

    @site.route("GET", "/")
    def rooms(s: Site, q: dict) -> str:
        items = "".join(f'<li><a href="/room?name={r}">{r}</a> (seats {n})</li>'
                        for r, n in s.state["rooms"].items())
        return page("Meeting rooms", f"<ul>{items}</ul>", NAV)

    @site.route("GET", "/room")
    def room(s: Site, q: dict) -> str:
        name = q.get("name", "")
        if name not in s.state["rooms"]:
            raise NotFound(f"no room {name}")
        head = "".join(f"<th>{d}</th>" for d in s.state["days"])
        rows = "".join(
            f"<tr><th>{slot}</th>" + "".join(
                f"<td>{'booked' if taken(s, name, d, slot) else 'free'}</td>"
                for d in s.state["days"]) + "</tr>" for slot in s.state["slots"])
        days = "".join(f"<option>{d}</option>" for d in s.state["days"])
        slots = "".join(f"<option>{t}</option>" for t in s.state["slots"])
        form = (f'<form method="post" action="/book"><input type="hidden" name="room" '
                f'value="{esc(name)}"><p><label>Day <select name="day">{days}</select></label>'
                f'</p><p><label>Time <select name="slot">{slots}</select></label></p><p><label>'
                'Meeting name <input name="title"></label></p><p><label>People <input '
                'name="people" type="number" min="1" value="1"></label></p><button>Book '
                "</button></form>")
        return page(f"Room {name}", f"<p>Seats: {s.state['rooms'][name]}</p><table><tr><th>"
                    f"</th>{head}</tr>{rows}</table><h2>Book this room</h2>{form}", NAV)

    @site.route("POST", "/book")
    def book(s: Site, f: dict) -> str:
        room, day, slot = f.get("room", ""), f.get("day", ""), f.get("slot", "")
        if room not in s.state["rooms"] or day not in s.state["days"] \
                or slot not in s.state["slots"]:
            raise NotFound("no such room, day or time")
        people = int(f["people"]) if str(f.get("people", "")).isdigit() else 0
        problem = ("That slot is already booked." if taken(s, room, day, slot) else
                   "Give the meeting a name." if not f.get("title", "").strip() else
                   f"{room} seats {s.state['rooms'][room]}." if not
                   0 < people <= s.state["rooms"][room] else None)
        if problem:
            return page("Booking failed", f"<p>{esc(problem)}</p>"
                        f'<p><a href="/room?name={esc(room)}">Back to {esc(room)}</a></p>', NAV)
        ident = max([b["id"] for b in s.state["bookings"]], default=0) + 1
        s.state["bookings"].append({"id": ident, "room": room, "day": day, "slot": slot,
                                    "name": f["title"].strip(), "people": people})
        raise Redirect("/bookings")

    @site.route("GET", "/bookings")
    def bookings(s: Site, q: dict) -> str:
        rows = "".join(
            f"<tr><td>{esc(b['name'])}</td><td>{b['room']}</td><td>{b['day']}</td>"
            f"<td>{b['slot']}</td><td>{b['people']}</td><td><form method=post action=/cancel>"
            f"<input type=hidden name=id value={b['id']}><button>Cancel {esc(b['name'])}"
            "</button></form></td></tr>" for b in s.state["bookings"])
        return page("My bookings", "<table><tr><th>Meeting</th><th>Room</th><th>Day</th><th>"
                    f"Time</th><th>People</th><th></th></tr>{rows}</table>"
                    if rows else "<p>No bookings.</p>", NAV)

    @site.route("POST", "/cancel")
    def cancel(s: Site, f: dict) -> str:
        s.state["bookings"] = [b for b in s.state["bookings"] if str(b["id"]) != f.get("id")]
        raise Redirect("/bookings")

    return site


if __name__ == "__main__":
    sys.exit(main(build))
