import pytest

from trieauto import Trie


@pytest.fixture
def trie():
    return Trie.from_counts({"car": 5, "cart": 2, "carbon": 2, "cat": 7, "dog": 1})


def test_len_and_contains(trie):
    assert len(trie) == 5
    assert "cart" in trie
    assert "ca" not in trie
    assert 42 not in trie


def test_insert_accumulates_frequency(trie):
    trie.insert("dog", 3)
    assert trie.frequency("dog") == 4
    assert len(trie) == 5


def test_complete_ranked_by_frequency(trie):
    assert trie.complete("ca") == ["cat", "car", "carbon", "cart"]
    assert trie.complete("car", limit=2) == ["car", "carbon"]


def test_complete_unknown_prefix(trie):
    assert trie.complete("x") == []


def test_has_prefix(trie):
    assert trie.has_prefix("carb")
    assert not trie.has_prefix("cab")


def test_case_insensitive_by_default():
    t = Trie(["Apple", "apple", "APPLY"])
    assert t.frequency("APPLE") == 2
    assert t.complete("ap") == ["apple", "apply"]


def test_case_sensitive_option():
    t = Trie(["Apple", "apple"], case_sensitive=True)
    assert len(t) == 2
    assert t.complete("A") == ["Apple"]


def test_items_sorted(trie):
    assert trie.items("car") == [("car", 5), ("carbon", 2), ("cart", 2)]


def test_insert_rejects_bad_input():
    t = Trie()
    with pytest.raises(ValueError):
        t.insert("")
    with pytest.raises(ValueError):
        t.insert("x", 0)
