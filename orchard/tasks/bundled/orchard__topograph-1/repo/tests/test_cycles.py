from topograph import DependencyGraph, find_cycle, has_cycle


def test_acyclic_graph():
    g = DependencyGraph({"a": ["b", "c"], "b": ["c"]})
    assert find_cycle(g) is None
    assert not has_cycle(g)


def test_two_node_cycle():
    g = DependencyGraph({"a": ["b"], "b": ["a"]})
    assert find_cycle(g) == ["a", "b", "a"]
    assert has_cycle(g)


def test_self_dependency():
    g = DependencyGraph()
    g.add("a", "a")
    assert find_cycle(g) == ["a", "a"]


def test_cycle_not_reachable_from_first_node():
    g = DependencyGraph({"top": ["leaf"], "x": ["y"], "y": ["z"], "z": ["x"]})
    assert find_cycle(g) == ["x", "y", "z", "x"]


def test_cycle_below_other_nodes():
    g = DependencyGraph({"app": ["lib"], "lib": ["util"], "util": ["lib"]})
    assert find_cycle(g) == ["lib", "util", "lib"]
