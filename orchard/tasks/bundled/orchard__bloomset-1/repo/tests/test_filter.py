import pytest

from bloomset import BloomSet


def test_no_false_negatives():
    bloom = BloomSet.for_capacity(500, 0.01)
    words = [f"word-{i}" for i in range(500)]
    bloom.update(words)
    assert all(w in bloom for w in words)
    assert len(bloom) == 500


def test_str_and_bytes_keys_agree():
    bloom = BloomSet(1024, 4)
    bloom.add("héllo")
    assert "héllo".encode("utf-8") in bloom
    assert 123 not in bloom
    with pytest.raises(TypeError):
        bloom.add(123)


def test_empty_filter_contains_nothing():
    bloom = BloomSet(256, 3)
    assert "anything" not in bloom
    assert bloom.bits_set() == 0
    assert bloom.estimated_error_rate() == 0.0


def test_union():
    a = BloomSet(2048, 5)
    b = BloomSet(2048, 5)
    a.add("alpha")
    b.add("beta")
    merged = a | b
    assert "alpha" in merged and "beta" in merged
    assert len(merged) == 2
    with pytest.raises(ValueError):
        a | BloomSet(1024, 5)


def test_roundtrip_bytes():
    bloom = BloomSet.for_capacity(100, 0.05)
    bloom.update(["x", "y", "z"])
    clone = BloomSet.from_bytes(bloom.to_bytes())
    assert (clone.num_bits, clone.num_hashes, len(clone)) == (bloom.num_bits, bloom.num_hashes, 3)
    assert all(k in clone for k in "xyz")
