from querystr import add_params, get_params


def test_get_params():
    qp = get_params("https://example.org/p?a=1&b=two%20words#frag")
    assert qp.to_dict() == {"a": "1", "b": "two words"}
    assert len(get_params("https://example.org/")) == 0


def test_add_params_keeps_fragment_and_existing():
    url = "https://example.org/search?q=x#results"
    assert add_params(url, {"page": 2}) == "https://example.org/search?q=x&page=2#results"


def test_add_params_repeats_keys():
    assert add_params("/p?tag=a", [("tag", "b")]) == "/p?tag=a&tag=b"


def test_add_params_without_query():
    assert add_params("/p", {"y": True}) == "/p?y=true"
    assert add_params("/p", {}) == "/p"


def test_add_params_keeps_bare_keys():
    assert add_params("/p?debug&x=", {"y": "1"}) == "/p?debug&x=&y=1"
