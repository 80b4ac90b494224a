import pytest

from querystr import QueryParams, build, parse


def test_parse_keeps_order_and_repeats():
    qp = parse("tag=a&q=x&tag=b")
    assert qp.items() == [("tag", "a"), ("q", "x"), ("tag", "b")]
    assert qp.getlist("tag") == ["a", "b"]
    assert qp.get("tag") == "a"
    assert qp.keys() == ["tag", "q"]
    assert qp.to_dict() == {"tag": "b", "q": "x"}


def test_parse_decoding():
    qp = parse("?q=hello+world&name=caf%C3%A9&eq=a%3Db&amp=%26")
    assert qp.to_dict() == {"q": "hello world", "name": "café", "eq": "a=b", "amp": "&"}


def test_parse_bare_and_empty_values():
    qp = parse("debug&empty=&&x=1")
    assert qp.items() == [("debug", None), ("empty", ""), ("x", "1")]
    assert "debug" in qp
    assert "nope" not in qp


def test_build_from_mapping_and_pairs():
    assert build({"q": "café au lait", "page": 2}) == "q=caf%C3%A9%20au%20lait&page=2"
    assert build([("a", 1), ("a", 2)]) == "a=1&a=2"
    assert build({"tag": ["x", "y"], "flag": None, "on": True}) == "tag=x&tag=y&flag&on=true"


def test_build_options():
    assert build({"q": "a b", "path": "/x/y"}, plus=True) == "q=a+b&path=/x/y"
    assert build([("b", 1), ("a", 2), ("b", 0)], sort=True) == "a=2&b=1&b=0"
    assert build({"k": "a&b=c"}) == "k=a%26b%3Dc"


@pytest.mark.parametrize(
    "query",
    ["a=1&b=2", "tag=x&tag=y", "debug&x=", "q=caf%C3%A9%20au%20lait", ""],
    ids=["simple", "repeated", "bare", "unicode", "empty"],
)
def test_roundtrip(query):
    assert build(parse(query)) == query


def test_set_add_remove():
    qp = QueryParams([("a", "1"), ("b", "2"), ("a", "3")])
    qp.set("a", 9)
    assert qp.items() == [("a", "9"), ("b", "2")]
    qp.add("b", None)
    assert qp.getlist("b") == ["2", None]
    assert qp.remove("b") == 2
    qp.set("c", False)
    assert str(qp) == "a=9&c=false"
    assert len(qp) == 2


def test_copy_and_equality():
    qp = parse("a=1")
    other = qp.copy()
    other.add("b", "2")
    assert qp == parse("a=1")
    assert qp != other
