from lrucache import ManualClock, make_key, memoize


def counted(func):
    calls = []

    def inner(*args, **kwargs):
        calls.append((args, kwargs))
        return func(*args, **kwargs)

    inner.calls = calls
    return inner


def test_results_are_cached():
    square = counted(lambda x: x * x)
    cached = memoize()(square)
    assert cached(4) == 16
    assert cached(4) == 16
    assert len(square.calls) == 1
    assert cached.cache.stats.hits == 1


def test_falsy_results_are_cached():
    zero = counted(lambda x: 0)
    cached = memoize()(zero)
    assert cached("a") == 0
    assert cached("a") == 0
    assert len(zero.calls) == 1


def test_keyword_order_does_not_matter():
    f = counted(lambda a, b=0, c=0: a + b + c)
    cached = memoize()(f)
    assert cached(1, b=2, c=3) == 6
    assert cached(1, c=3, b=2) == 6
    assert len(f.calls) == 1
    assert make_key((1,), {"b": 2}) != make_key((1, ("b", 2)), {})


def test_maxsize_evicts():
    f = counted(lambda x: x)
    cached = memoize(maxsize=2)(f)
    for x in (1, 2, 3, 1):
        cached(x)
    assert [c[0][0] for c in f.calls] == [1, 2, 3, 1]


def test_ttl_recomputes_after_expiry():
    clock = ManualClock()
    f = counted(lambda x: x + 1)
    cached = memoize(ttl=60, clock=clock)(f)
    cached(1)
    clock.advance(59)
    cached(1)
    clock.advance(1)
    cached(1)
    assert len(f.calls) == 2


def test_custom_key_and_cache_clear():
    f = counted(lambda user, request_id: user.upper())
    cached = memoize(key=lambda user, request_id: user)(f)
    assert cached("ann", 1) == "ANN"
    assert cached("ann", 2) == "ANN"
    assert len(f.calls) == 1
    cached.cache_clear()
    cached("ann", 3)
    assert len(f.calls) == 2


def test_wraps_metadata():
    @memoize()
    def documented(x):
        """Docs."""
        return x

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Docs."
