from mdtoc import Heading, parse_headings

DOC = """\
# Project

Intro text.

## Install ##

```bash
# not a heading
pip install project
```

### Tips & tricks
#hashtag is not a heading
####### seven hashes is not a heading either
"""


def test_levels_and_lines():
    assert parse_headings(DOC) == [
        Heading(1, "Project", 1),
        Heading(2, "Install", 5),
        Heading(3, "Tips & tricks", 12),
    ]


def test_closing_sequence_removed():
    assert parse_headings("## Usage ###")[0].text == "Usage"
    assert parse_headings("### Issue #42")[0].text == "Issue #42"


def test_tilde_fence_and_unclosed_fence():
    doc = "~~~\n# inside\n~~~\n# after\n```\n# never closed\n"
    assert [h.text for h in parse_headings(doc)] == ["after"]


def test_inline_markup_stripped():
    [h] = parse_headings("## The `run()` **method** and [docs](https://x.org)")
    assert h.text == "The run() method and docs"


def test_empty_heading_skipped():
    assert parse_headings("#\n## \n# Real") == [Heading(1, "Real", 3)]
