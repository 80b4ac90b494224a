"""Generated assistant tasks: templates filled from seeded pools of people, topics and dates.

Each template builds a world (the facts the task needs, among distractors: other people's mail,
other meetings, other files), the user's request, the checks that judge it and a gold solution.
``generate(n, seed)`` cycles through the templates, so 200 tasks hold 20 of each; every fourth
task is in the test split. The same seed gives the same tasks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from orchard.domains.assistant.model import EMPTY_WORLD, AssistantTask

FIRST = ["Dana", "Priya", "Marco", "Lena", "Omar", "Sofia", "Kenji", "Aisha", "Tom", "Ines",
         "Yuki", "Carlos", "Mei", "Noah", "Zara", "Felix"]
LAST = ["Lee", "Shah", "Rossi", "Berg", "Haddad", "Costa", "Sato", "Bello", "Price", "Moreau"]
COMPANIES = ["Northwind", "Contoso", "Globex", "Initech", "Umbrella", "Stark Labs", "Hooli",
             "Vandelay", "Acme", "Wonka"]
TOPICS = ["budget review", "launch plan", "hiring sync", "design critique", "vendor call",
          "quarterly goals", "security audit", "roadmap", "customer demo", "offsite planning"]
DAYS = ["2026-03-03", "2026-03-04", "2026-03-05", "2026-03-06", "2026-03-09", "2026-03-10"]
HOURS = ["09:00", "10:00", "11:00", "13:00", "14:00", "15:00", "16:00"]
FACTS = [("Lake Baikal", "deepest lake", "1,642 metres"), ("Mount Kilimanjaro",
         "highest mountain in Africa", "5,895 metres"), ("The Danube", "second-longest river "
         "in Europe", "2,850 kilometres"), ("The Atacama", "driest desert", "less than 1 mm of "
         "rain a year"), ("Angel Falls", "highest waterfall", "979 metres"), ("Mount Elbrus",
         "highest mountain in Europe", "5,642 metres"), ("Lake Titicaca", "highest navigable "
         "lake", "3,812 metres above sea level"), ("The Mariana Trench", "deepest trench",
         "10,935 metres"), ("The Sahara", "largest hot desert", "9.2 million square km")]
NOTE_TITLES = ["{}", "About {}", "{} facts", "Notes on {}"]

VISITS = ["It is visited by many.", "Few people go there.", "It is a protected site.",
          "It was surveyed again last year.", "Its name has several spellings."]

Template = Callable[[random.Random, str], dict[str, Any]]


def _people(rng: random.Random, n: int) -> list[dict[str, str]]:
    names = rng.sample([f"{f} {ln}" for f in FIRST for ln in LAST], n)
    return [{"name": name, "email": f"{name.split()[0].lower()}.{name.split()[1].lower()}"
             f"@{rng.choice(COMPANIES).lower().replace(' ', '')}.com",
             "phone": f"+1 555 {rng.randrange(1000, 9999)}", "company": rng.choice(COMPANIES)}
            for name in names]


def _plus(time: str, minutes: int) -> str:
    hour, minute = int(time[11:13]), int(time[14:16]) + minutes
    return f"{time[:11]}{hour + minute // 60:02d}:{minute % 60:02d}"


def _mail(i: int, sender: dict[str, str], subject: str, body: str, day: str,
          folder: str = "inbox", read: bool = False) -> dict[str, Any]:
    return {"id": f"m{i}", "folder": folder, "from": sender["email"],
            "to": [EMPTY_WORLD["user"]["email"]], "cc": [], "subject": subject, "body": body,
            "date": f"{day}T08:{i % 60:02d}", "read": read, "in_reply_to": None}


def _event(i: int, title: str, start: str, attendees: list[str], minutes: int = 60
           ) -> dict[str, Any]:
    return {"id": f"e{i}", "title": title, "start": start, "end": _plus(start, minutes),
            "attendees": attendees, "location": ""}


def _base(rng: random.Random, people: list[dict[str, str]]) -> dict[str, Any]:
    """Distractors: a few mails and meetings of other people, on other topics."""
    mail = [_mail(i + 1, p, f"Re: {rng.choice(TOPICS)}", "Thanks, see you there.",
                  "2026-02-2" + str(i)) for i, p in enumerate(people[-3:])]
    events = [_event(i + 1, rng.choice(TOPICS).title(), f"{DAYS[i]}T{HOURS[i]}",
                     [p["email"]]) for i, p in enumerate(people[-2:])]
    return {"contacts": people, "mail": mail, "events": events}


def reply_with_figure(rng: random.Random, iid: str) -> dict[str, Any]:
    people = _people(rng, 6)
    asker, topic = people[0], rng.choice(TOPICS)
    figure = f"${rng.randrange(12, 95)},{rng.randrange(100, 999)}"
    world = _base(rng, people)
    ask = _mail(10, asker, f"Question about the {topic}",
                f"Hi Alex, what is the total for the {topic}? It is in your files.", "2026-03-01")
    world["mail"].append(ask)
    path = f"/docs/{topic.replace(' ', '-')}.txt"
    world["files"] = {path: f"{topic.title()}\nTotal: {figure}\n", "/docs/old.txt": "Total: $1"}
    return {"goal": f"Reply to {asker['name']}'s email about the {topic} with the total from my "
                    "files.",
            "world": world,
            "checks": [{"name": "sent", "args": {"to": [asker["email"]], "body": [figure],
                                                 "in_reply_to": "m10"}}],
            "rubric": [{"criterion": f"The reply gives the {topic} total, {figure}.",
                        "weight": 2},
                       {"criterion": f"It answers {asker['name']}'s question email.",
                        "weight": 1}],
            "gold": [{"tool": "mail_search", "args": {"query": topic}},
                     {"tool": "files_read", "args": {"path": path}},
                     {"tool": "mail_send", "args": {
                         "to": [asker["email"]], "subject": f"Re: Question about the {topic}",
                         "body": f"The total is {figure}.", "in_reply_to": "m10"}}]}


def schedule_meeting(rng: random.Random, iid: str) -> dict[str, Any]:
    people = _people(rng, 6)
    guest, topic = people[0], rng.choice(TOPICS)
    start = f"{rng.choice(DAYS)}T{rng.choice(HOURS)}"
    minutes = rng.choice([30, 45, 60])
    return {"goal": f"Schedule a {minutes}-minute meeting called '{topic.title()}' with "
                    f"{guest['name']} starting {start.replace('T', ' at ')}.",
            "world": _base(rng, people),
            "checks": [{"name": "event", "args": {"title": topic, "start": start,
                                                  "end": _plus(start, minutes),
                                                  "attendees": [guest["email"]]}}],
            "gold": [{"tool": "contacts_search", "args": {"query": guest["name"]}},
                     {"tool": "calendar_create", "args": {
                         "title": topic.title(), "start": start,
                         "end": _plus(start, minutes), "attendees": [guest["email"]]}}]}


def move_meeting(rng: random.Random, iid: str) -> dict[str, Any]:
    people = _people(rng, 6)
    topic = rng.choice(TOPICS)
    old, new = rng.sample(DAYS, 2)
    hour = rng.choice(HOURS)
    world = _base(rng, people)
    world["events"].append(_event(10, topic.title(), f"{old}T{hour}", [people[0]["email"]]))
    return {"goal": f"Move my '{topic.title()}' meeting to {new}, same time and length.",
            "world": world,
            "checks": [{"name": "event", "args": {"title": topic, "start": f"{new}T{hour}",
                                                  "end": _plus(f"{new}T{hour}", 60)}},
                       {"name": "no_event", "args": {"title": topic, "start": f"{old}T{hour}"}}],
            "gold": [{"tool": "calendar_list", "args": {}},
                     {"tool": "calendar_update", "args": {
                         "id": "e10", "start": f"{new}T{hour}",
                         "end": _plus(f"{new}T{hour}", 60)}}]}


def cancel_and_notify(rng: random.Random, iid: str) -> dict[str, Any]:
    people = _people(rng, 6)
    topic, day, hour = rng.choice(TOPICS), rng.choice(DAYS), rng.choice(HOURS)
    guests = [p["email"] for p in people[:2]]
    world = _base(rng, people)
    world["events"].append(_event(10, topic.title(), f"{day}T{hour}", guests))
    return {"goal": f"Cancel the '{topic.title()}' meeting on {day} and email its attendees "
                    "that it is cancelled.",
            "world": world,
            "checks": [{"name": "no_event", "args": {"id": "e10"}},
                       {"name": "sent", "args": {"to": guests, "body": ["cancel"]}}],
            "rubric": [{"criterion": f"The email says the {topic} meeting on {day} is "
                                     "cancelled."}],
            "gold": [{"tool": "calendar_list", "args": {}},
                     {"tool": "calendar_cancel", "args": {"id": "e10"}},
                     {"tool": "mail_send", "args": {
                         "to": guests, "subject": f"Cancelled: {topic.title()}",
                         "body": f"The {topic} meeting on {day} is cancelled."}}]}


def answer_invitation(rng: random.Random, iid: str) -> dict[str, Any]:
    """Judgement: accept only if the invitation fits the calendar."""
    people = _people(rng, 6)
    topic, day, hour = rng.choice(TOPICS), rng.choice(DAYS), rng.choice(HOURS)
    world = _base(rng, people)
    clash = rng.random() < 0.5
    if clash:
        world["events"].append(_event(10, "Dentist", f"{day}T{hour}", []))
    invite = {"title": topic.title(), "start": f"{day}T{hour}",
              "end": _plus(f"{day}T{hour}", 60), "attendees": [people[0]["email"]]}
    world["invitations"] = [{"id": "i1", "from": people[0]["email"], "event": invite,
                             "status": "pending"}]
    response = "decline" if clash else "accept"
    status = "declined" if clash else "accepted"
    checks = [{"name": "invitation", "args": {"id": "i1", "status": status}}]
    return {"goal": f"Answer {people[0]['name']}'s invitation: accept it if I am free then, "
                    "decline it otherwise.",
            "world": world, "checks": checks,
            "gold": [{"tool": "calendar_invitations", "args": {}},
                     {"tool": "calendar_list", "args": {"start_day": day, "end_day": day}},
                     {"tool": "calendar_respond", "args": {"id": "i1", "response": response}}]}


def archive_newsletters(rng: random.Random, iid: str) -> dict[str, Any]:
    people = _people(rng, 6)
    box = rng.choice(["news", "updates", "digest", "hello"])
    sender = {"email": f"{box}@{rng.choice(COMPANIES).lower().replace(' ', '')}.com"}
    world = _base(rng, people)
    ids = []
    for n in range(rng.randrange(2, 4)):
        world["mail"].append(_mail(10 + n, sender, f"Newsletter #{n + 1}", "This week...",
                                   "2026-03-01"))
        ids.append(f"m{10 + n}")
    return {"goal": f"Archive every newsletter from {sender['email']}.",
            "world": world,
            "checks": [{"name": "folder", "args": {"id": i, "folder": "archive"}} for i in ids]
            + [{"name": "folder", "args": {"id": "m1", "folder": "inbox"}}],
            "gold": [{"tool": "mail_search", "args": {"query": sender["email"]}}]
            + [{"tool": "mail_move", "args": {"id": i, "folder": "archive"}} for i in ids]}


def todo_from_mail(rng: random.Random, iid: str) -> dict[str, Any]:
    people = _people(rng, 6)
    topic, due = rng.choice(TOPICS), rng.choice(DAYS)
    world = _base(rng, people)
    world["mail"].append(_mail(10, people[0], f"Deadline: {topic}",
                               f"Please send me your notes on the {topic} by {due}.",
                               "2026-03-01"))
    return {"goal": f"Add a todo for what {people[0]['name']} asked me by email, due when "
                    "they need it.",
            "world": world,
            "checks": [{"name": "todo", "args": {"text": [topic], "due": due}}],
            "rubric": [{"criterion": f"The todo names the {topic} notes and "
                                     f"{people[0]['name']}."}],
            "gold": [{"tool": "mail_search", "args": {"query": people[0]["email"]}},
                     {"tool": "mail_read", "args": {"id": "m10"}},
                     {"tool": "todos_add", "args": {"text": f"Send notes on the {topic} to "
                                                            f"{people[0]['name']}",
                                                    "due": due}}]}


def phone_lookup(rng: random.Random, iid: str) -> dict[str, Any]:
    people = _people(rng, 8)
    who = people[rng.randrange(len(people))]
    return {"goal": f"What is {who['name']}'s phone number?",
            "world": {"contacts": people},
            "checks": [{"name": "answer", "args": {"contains": [who["phone"]]}}],
            "gold": [{"tool": "contacts_search", "args": {"query": who["name"]}}],
            "answer": f"{who['name']}'s number is {who['phone']}."}


def research_note(rng: random.Random, iid: str) -> dict[str, Any]:
    place, what, value = rng.choice(FACTS)
    pages = [{"url": f"https://wiki.example/{p.replace(' ', '_')}", "title": p,
              "text": f"{p} is the {w}: {v}. {rng.choice(VISITS)}"} for p, w, v in FACTS]
    rng.shuffle(pages)
    title = rng.choice(NOTE_TITLES).format(place)
    return {"goal": f"Look up how big {place} is on the web and save it in a note titled "
                    f"'{title}'.",
            "world": {"web": pages},
            "checks": [{"name": "note", "args": {"contains": [title, value]}}],
            "rubric": [{"criterion": f"The note gives how big {place} is: {value}."}],
            "gold": [{"tool": "web_search", "args": {"query": place}},
                     {"tool": "notes_add", "args": {"title": title,
                                                    "body": f"{place}: {value}"}}]}


def attendee_report(rng: random.Random, iid: str) -> dict[str, Any]:
    people = _people(rng, 6)
    day = rng.choice(DAYS)
    world = _base(rng, people)
    guests = [people[0], people[1]]
    world["events"] += [_event(10, "Standup", f"{day}T09:00", [guests[0]["email"]], 15),
                        _event(11, "Review", f"{day}T15:00", [guests[1]["email"]])]
    path = f"/reports/{rng.choice(['people', 'attendees', 'meetings', 'who'])}-{day}.txt"
    return {"goal": f"Write {path} listing the email of everyone I meet on {day}, one a line.",
            "world": world,
            "checks": [{"name": "file", "args": {"path": path,
                                                 "contains": [g["email"] for g in guests]}}],
            "gold": [{"tool": "calendar_list", "args": {"start_day": day, "end_day": day}},
                     {"tool": "files_write", "args": {
                         "path": path,
                         "content": "\n".join(sorted({a for e in world["events"]
                                                      if e["start"][:10] == day
                                                      for a in e["attendees"]})) + "\n"}}]}


TEMPLATES: list[Template] = [reply_with_figure, schedule_meeting, move_meeting,
                             cancel_and_notify, answer_invitation, archive_newsletters,
                             todo_from_mail, phone_lookup, research_note, attendee_report]


def generate(n: int = 200, seed: int = 0) -> list[AssistantTask]:
    """``n`` tasks, the templates in turn; every fourth in the test split. No two ask the same:
    a request must tell its task apart (a scripted teacher knows a task by it), so a draw that
    repeats one is drawn again."""
    tasks: list[AssistantTask] = []
    goals: set[str] = set()
    for i in range(n):
        template = TEMPLATES[i % len(TEMPLATES)]
        iid = f"gen-{template.__name__.replace('_', '-')}-{i // len(TEMPLATES):03d}"
        for attempt in range(100):
            made = template(random.Random(f"{seed}:{i}:{attempt}"), iid)
            if made["goal"] not in goals:
                break
        else:
            raise ValueError(f"template {template.__name__} ran out of distinct requests at "
                             f"task {i}; widen its pools")
        goals.add(made["goal"])
        tasks.append(AssistantTask.model_validate({
            "instance_id": iid, **made, "split": "test" if i % 4 == 3 else "train",
            "metadata": {"template": template.__name__, "seed": seed}}))
    return tasks
