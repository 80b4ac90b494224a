import pytest

from topograph import CycleError, DependencyGraph, static_order


def test_dependencies_come_first():
    g = DependencyGraph()
    g.add("app", "lib", "config")
    g.add("lib", "config")
    assert static_order(g) == ["config", "lib", "app"]


def test_ties_broken_by_insertion_order():
    g = DependencyGraph({"c": [], "a": [], "b": []})
    assert static_order(g) == ["c", "a", "b"]


def test_diamond():
    g = DependencyGraph({"top": ["left", "right"], "left": ["base"], "right": ["base"]})
    assert static_order(g) == ["base", "left", "right", "top"]


def test_empty_graph():
    assert static_order(DependencyGraph()) == []


def test_cycle_raises():
    g = DependencyGraph({"a": ["b"], "b": ["a"]})
    with pytest.raises(CycleError) as exc:
        static_order(g)
    assert set(exc.value.cycle) == {"a", "b"}
    assert str(exc.value).startswith("dependency cycle: ")


def test_cycle_error_is_value_error():
    g = DependencyGraph()
    g.add("x", "x")
    with pytest.raises(ValueError):
        static_order(g)
