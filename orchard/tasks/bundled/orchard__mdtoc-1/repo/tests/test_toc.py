import pytest

from mdtoc import build_toc, insert_toc, slugify


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("Tips & tricks") == "tips--tricks"
    assert slugify("snake_case and kebab-case") == "snake_case-and-kebab-case"
    assert slugify("Über uns") == "über-uns"


def test_build_toc_nested():
    doc = "# Title\n## Install\n### From source\n## Usage\n"
    assert build_toc(doc) == (
        "- [Title](#title)\n"
        "  - [Install](#install)\n"
        "    - [From source](#from-source)\n"
        "  - [Usage](#usage)"
    )


def test_duplicate_slugs():
    doc = "## Example\n## Example\n## Example 1\n"
    assert build_toc(doc, min_level=2) == (
        "- [Example](#example)\n"
        "- [Example](#example-1)\n"
        "- [Example 1](#example-1-1)"
    )


def test_level_filter_keeps_slug_numbering():
    doc = "# Notes\n#### Notes\n## Notes\n"
    assert build_toc(doc, max_level=2) == "- [Notes](#notes)\n  - [Notes](#notes-2)"


def test_invalid_levels():
    with pytest.raises(ValueError):
        build_toc("# x", min_level=3, max_level=2)


def test_insert_toc_replaces_block():
    doc = "# A\n<!-- toc -->\nold\n<!-- tocstop -->\n## B\n"
    assert insert_toc(doc) == (
        "# A\n<!-- toc -->\n\n- [A](#a)\n  - [B](#b)\n\n<!-- tocstop -->\n## B\n"
    )
    assert insert_toc("# no marker") == "# no marker"
