"""A wiki: articles, full-text search, and edits that are kept with their summaries."""

from __future__ import annotations

import sys

from sitekit import NotFound, Redirect, Site, esc, main, page  # beside it: run as a script

ARTICLES = {
    "Python": "Python is a programming language created by Guido van Rossum and first "
              "released in 1991. Its reference implementation is CPython.",
    "Linux": "Linux is a family of operating systems built on the Linux kernel, first released "
             "by Linus Torvalds on 17 September 1991.",
    "Rust": "Rust is a systems programming language whose first stable release, 1.0, came out "
            "in May 2015. Its package manager is called Cargo.",
    "Mount Everest": "Mount Everest is the highest mountain above sea level, at 8,849 metres. "
                     "It lies on the border of Nepal and China.",
    "Amazon River": "The Amazon River in South America is about 6,400 km long and carries "
                    "more water than any other river.",
    "Marie Curie": "Marie Curie was a physicist and chemist who won the Nobel Prize twice: in "
                   "physics in 1903 and in chemistry in 1911.",
    "Coffee": "Coffee is brewed from roasted coffee beans. The two most common species are "
              "arabica and robusta.",
    "Honey Bee": "A honey bee colony has one queen, thousands of female workers and, in "
                 "summer, a few hundred male drones.",
}
SEED = {"articles": ARTICLES, "edits": []}
NAV = ('<a href="/">Main page</a><a href="/all">All articles</a><form action="/search" '
       'style="display:inline"><input name="q" aria-label="Search the wiki"><button>Search'
       '</button></form>')


def build(state_path: str) -> Site:
    site = Site(state_path, SEED)

    def link(title: str) -> str:
        return f'<a href="/wiki?title={esc(title)}">{esc(title)}</a>'

    @site.route("GET", "/")
    def home(s: Site, q: dict) -> str:
        return page("Wiki", "<p>Welcome. Search, or browse all articles.</p>", NAV)

    @site.route("GET", "/all")
    def everything(s: Site, q: dict) -> str:
        items = "".join(f"<li>{link(t)}</li>" for t in sorted(s.state["articles"]))
        return page("All articles", f"<ul>{items}</ul>", NAV)

    @site.route("GET", "/search")
    def search(s: Site, q: dict) -> str:
        term = q.get("q", "").strip().lower()
        hits = [t for t, body in sorted(s.state["articles"].items())
                if term and (term in t.lower() or term in body.lower())]
        items = "".join(f"<li>{link(t)}</li>" for t in hits)
        return page(f"Search: {term}", f"<ul>{items}</ul>" if hits else "<p>No results.</p>",
                    NAV)

    @site.route("GET", "/wiki")
    def article(s: Site, q: dict) -> str:
        title = q.get("title", "")
        if title not in s.state["articles"]:
            raise NotFound(f"no article {title}")
        return page(title, f"<p>{esc(s.state['articles'][title])}</p>"
                    f'<p><a href="/edit?title={esc(title)}">Edit this article</a></p>', NAV)

    @site.route("GET", "/edit")
    def edit(s: Site, q: dict) -> str:
        title = q.get("title", "")
        if title not in s.state["articles"]:
            raise NotFound(f"no article {title}")
        return page(f"Editing {title}", f'<form method="post" action="/edit"><input '
                    f'type="hidden" name="title" value="{esc(title)}"><p><label>Text '
                    f'<textarea name="text" rows="6" cols="80">{esc(s.state["articles"][title])}'
                    '</textarea></label></p><p><label>Edit summary <input name="summary">'
                    "</label></p><button>Save</button></form>", NAV)

    @site.route("POST", "/edit")
    def save(s: Site, f: dict) -> str:
        title = f.get("title", "")
        if title not in s.state["articles"]:
            raise NotFound(f"no article {title}")
        s.state["articles"][title] = f.get("text", "").strip()
        s.state["edits"].append({"title": title, "summary": f.get("summary", "").strip()})
        raise Redirect(f"/wiki?title={title}")

    return site


if __name__ == "__main__":
    sys.exit(main(build))
