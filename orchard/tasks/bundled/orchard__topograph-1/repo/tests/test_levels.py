import pytest

from topograph import CycleError, DependencyGraph, batches


def test_batches_by_depth():
    g = DependencyGraph({"app": ["lib", "config"], "lib": ["config"], "docs": []})
    assert batches(g) == [["config", "docs"], ["lib"], ["app"]]


def test_diamond_batches():
    g = DependencyGraph({"top": ["left", "right"], "left": ["base"], "right": ["base"]})
    assert batches(g) == [["base"], ["left", "right"], ["top"]]


def test_empty_graph():
    assert batches(DependencyGraph()) == []


def test_cycle_raises():
    g = DependencyGraph({"a": ["b"], "b": ["c"], "c": ["a"]})
    with pytest.raises(CycleError) as exc:
        batches(g)
    assert set(exc.value.cycle) == {"a", "b", "c"}
