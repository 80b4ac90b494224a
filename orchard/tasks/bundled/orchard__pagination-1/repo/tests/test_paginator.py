import pytest

from pagination import EmptyPage, PageNotAnInteger, Paginator


def test_pages_and_items():
    p = Paginator(list("abcdefg"), 3)
    assert p.num_pages == 3
    assert list(p.page_range) == [1, 2, 3]
    assert p.page(1).items == ["a", "b", "c"]
    assert p.page(3).items == ["g"]


def test_page_indexes_and_neighbours():
    p = Paginator(range(25), 10)
    page = p.page(2)
    assert (page.start_index(), page.end_index()) == (11, 20)
    assert page.has_next() and page.has_previous()
    assert (page.previous_page_number(), page.next_page_number()) == (1, 3)
    last = p.page(3)
    assert (last.start_index(), last.end_index()) == (21, 25)
    assert not last.has_next()
    assert repr(last) == "<Page 3 of 3>"


def test_orphans_are_folded_into_the_previous_page():
    p = Paginator(range(23), 10, orphans=3)
    assert p.num_pages == 2
    assert list(p.page(2).items) == list(range(10, 23))
    assert p.page(2).end_index() == 23


def test_last_page_larger_than_orphans_stays():
    p = Paginator(range(24), 10, orphans=3)
    assert p.num_pages == 3
    assert len(p.page(3)) == 4


def test_single_short_page_with_orphans():
    p = Paginator(range(2), 10, orphans=5)
    assert p.num_pages == 1
    assert list(p.page(1).items) == [0, 1]


def test_empty_sequence():
    p = Paginator([], 10)
    assert p.num_pages == 1
    page = p.page(1)
    assert len(page) == 0 and page.start_index() == 0 and page.end_index() == 0
    assert Paginator([], 10, allow_empty_first_page=False).num_pages == 0
    with pytest.raises(EmptyPage):
        Paginator([], 10, allow_empty_first_page=False).page(1)


def test_invalid_page_numbers():
    p = Paginator(range(30), 10)
    with pytest.raises(PageNotAnInteger):
        p.page("two")
    with pytest.raises(PageNotAnInteger):
        p.page(1.5)
    with pytest.raises(EmptyPage):
        p.page(0)
    with pytest.raises(EmptyPage):
        p.page(4)
    assert p.page("2").number == 2


def test_get_page_is_forgiving():
    p = Paginator(range(30), 10)
    assert p.get_page("x").number == 1
    assert p.get_page(99).number == 3


def test_bad_arguments():
    with pytest.raises(ValueError):
        Paginator([], 0)
    with pytest.raises(ValueError):
        Paginator([], 5, orphans=-1)
