from tablefmt import format_table


def test_markdown_basic():
    out = format_table([["apple", 3], ["kiwi", 12.5]], headers=["fruit", "qty"], fmt="markdown")
    assert out == (
        "| fruit |  qty |\n"
        "| :---- | ---: |\n"
        "| apple |    3 |\n"
        "| kiwi  | 12.5 |"
    )


def test_markdown_center_and_min_width():
    out = format_table([["a", "b"]], headers=["x", "y"], fmt="markdown", align="cl")
    assert out.splitlines() == ["|  x  | y   |", "| :-: | :-- |", "|  a  | b   |"]


def test_markdown_escapes_pipes():
    out = format_table([["a|b", 1]], headers=["expr", "n"], fmt="markdown")
    assert out.splitlines()[2] == "| a\\|b |   1 |"


def test_markdown_without_headers():
    out = format_table([["x", 1]], fmt="markdown")
    assert out.splitlines() == ["|     |     |", "| :-- | --: |", "| x   |   1 |"]
