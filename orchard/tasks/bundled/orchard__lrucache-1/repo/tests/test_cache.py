import pytest

from lrucache import LRUCache, ManualClock


def test_get_and_put():
    cache = LRUCache(maxsize=2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing") is None
    assert cache.get("missing", "dflt") == "dflt"


def test_evicts_least_recently_used():
    cache = LRUCache(maxsize=2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    cache.put("c", 3)
    assert "b" not in cache
    assert list(cache.keys()) == ["a", "c"]
    assert cache.stats.evictions == 1


def test_peek_does_not_touch_recency():
    cache = LRUCache(maxsize=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.peek("a") == 1
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.stats.hits == 0


def test_put_existing_key_updates_and_refreshes():
    cache = LRUCache(maxsize=2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert list(cache.keys()) == ["a", "c"]
    assert cache.get("a") == 10


def test_stores_none_and_falsy_values():
    cache = LRUCache()
    cache.put("none", None)
    cache.put("zero", 0)
    assert "none" in cache
    assert cache.get("none", "dflt") is None
    assert cache.get("zero") == 0


def test_ttl_expiry():
    clock = ManualClock()
    cache = LRUCache(ttl=10, clock=clock)
    cache.put("a", 1)
    clock.advance(9.99)
    assert cache.get("a") == 1
    clock.advance(0.01)
    assert cache.get("a") is None
    assert cache.stats.expirations == 1


def test_per_entry_ttl():
    clock = ManualClock()
    cache = LRUCache(clock=clock)
    cache.put("short", 1, ttl=1)
    cache.put("forever", 2)
    clock.advance(100)
    assert "short" not in cache
    assert cache.get("forever") == 2


def test_eviction_prefers_expired_entries():
    clock = ManualClock()
    cache = LRUCache(maxsize=2, clock=clock)
    cache.put("old", 1)
    cache.put("brief", 2, ttl=5)
    clock.advance(5)
    cache.put("new", 3)
    assert list(cache.keys()) == ["old", "new"]
    assert cache.stats.evictions == 0


def test_len_purges_expired():
    clock = ManualClock()
    cache = LRUCache(ttl=1, clock=clock)
    cache.put("a", 1)
    cache.put("b", 2)
    clock.advance(1)
    cache.put("c", 3)
    assert len(cache) == 1


def test_stats_and_hit_rate():
    cache = LRUCache()
    cache.put("a", 1)
    cache.get("a")
    cache.get("a")
    cache.get("b")
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)
    assert cache.stats.hit_rate == pytest.approx(2 / 3)


def test_delete_and_clear():
    cache = LRUCache()
    cache.put("a", 1)
    assert cache.delete("a") is True
    assert cache.delete("a") is False
    cache.put("b", 2)
    cache.clear()
    assert len(cache) == 0


@pytest.mark.parametrize("kwargs", [{"maxsize": 0}, {"ttl": 0}, {"ttl": -1}],
                         ids=["maxsize-0", "ttl-0", "ttl-negative"])
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        LRUCache(**kwargs)


def test_manual_clock_cannot_go_back():
    with pytest.raises(ValueError):
        ManualClock().advance(-1)
