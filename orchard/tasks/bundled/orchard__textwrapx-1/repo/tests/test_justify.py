from textwrapx import justify, justify_line


def test_extra_spaces_go_left_first():
    assert justify_line("a b c d", 10) == "a  b  c  d"
    assert justify_line("a b c d", 11) == "a   b  c  d"


def test_single_word_line_unchanged():
    assert justify_line("hello", 12) == "hello"


TEXT = "Justified text spreads words out so that both margins line up."


def test_justify_paragraph():
    assert justify(TEXT, 15) == [
        "Justified  text",
        "spreads   words",
        "out   so   that",
        "both    margins",
        "line up.",
    ]


def test_justified_lines_keep_all_words():
    for width in (15, 19, 21):
        lines = justify(TEXT, width)
        assert all(len(line) == width for line in lines[:-1])
        assert " ".join(" ".join(lines).split()) == TEXT
