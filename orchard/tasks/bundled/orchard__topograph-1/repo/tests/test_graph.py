import pytest

from topograph import DependencyGraph, NodeNotFoundError


def make():
    g = DependencyGraph()
    g.add("app", "lib", "config")
    g.add("lib", "config", "util")
    g.add("docs")
    return g


def test_nodes_in_first_mention_order():
    assert make().nodes == ["app", "lib", "config", "util", "docs"]


def test_dependencies_and_dependents():
    g = make()
    assert g.dependencies("app") == ["lib", "config"]
    assert g.dependents("config") == ["app", "lib"]
    assert g.dependencies("docs") == []
    assert "util" in g
    assert len(g) == 5


def test_add_is_idempotent():
    g = make()
    g.add("app", "lib")
    assert g.dependencies("app") == ["lib", "config"]


def test_remove():
    g = make()
    g.remove("config")
    assert g.dependencies("app") == ["lib"]
    assert "config" not in g
    with pytest.raises(NodeNotFoundError):
        g.remove("config")


def test_unknown_node():
    g = make()
    with pytest.raises(NodeNotFoundError):
        g.dependencies("nope")
    with pytest.raises(KeyError):
        g.dependents("nope")


def test_transitive_dependencies_and_subgraph():
    g = make()
    assert g.transitive_dependencies("app") == ["lib", "config", "util"]
    sub = g.subgraph(["lib"])
    assert sub.nodes == ["lib", "config", "util"]
    assert list(sub.edges()) == [("lib", "config"), ("lib", "util")]


def test_copy_is_independent():
    g = make()
    c = g.copy()
    c.add("docs", "app")
    assert g.dependencies("docs") == []
    assert c.nodes == g.nodes


def test_mapping_constructor():
    g = DependencyGraph({"a": ["b"], "b": []})
    assert list(g.edges()) == [("a", "b")]
    assert repr(g) == "DependencyGraph({'a': ['b'], 'b': []})"
