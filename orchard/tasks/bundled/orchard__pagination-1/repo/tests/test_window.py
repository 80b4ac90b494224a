import pytest

from pagination import page_links, page_window, render_links


@pytest.mark.parametrize("current,expected", [
    (1, [1, 2, 3, 4, 5]),
    (2, [1, 2, 3, 4, 5]),
    (6, [4, 5, 6, 7, 8]),
    (9, [6, 7, 8, 9, 10]),
    (10, [6, 7, 8, 9, 10]),
])
def test_page_window(current, expected):
    assert page_window(current, 10) == expected


def test_page_window_with_few_pages():
    assert page_window(2, 3) == [1, 2, 3]
    assert page_window(1, 0) == []
    with pytest.raises(ValueError):
        page_window(4, 3)


def test_page_links():
    assert page_links(6, 20) == [1, None, 4, 5, 6, 7, 8, None, 20]
    assert page_links(1, 20) == [1, 2, 3, 4, 5, None, 20]
    assert page_links(5, 20) == [1, 2, 3, 4, 5, 6, 7, None, 20]


def test_render_links():
    assert render_links(10, 10) == "1 \u2026 6 7 8 9 [10]"
    assert render_links(2, 4) == "1 [2] 3 4"
