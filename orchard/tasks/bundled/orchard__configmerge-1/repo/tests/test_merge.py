import pytest

from configmerge import Merger, deep_merge, parse_key


def test_parse_key():
    assert parse_key("a!") == ("a", "replace")
    assert parse_key("a+") == ("a", "append")
    assert parse_key("a~") == ("a", "delete")
    assert parse_key("!") == ("!", None)


def test_nested_dicts_merge():
    base = {"db": {"host": "localhost", "port": 5432}, "debug": False}
    override = {"db": {"host": "db.internal"}, "debug": True}
    assert deep_merge(base, override) == {
        "db": {"host": "db.internal", "port": 5432},
        "debug": True,
    }


def test_replace_and_delete_directives():
    base = {"db": {"host": "localhost", "port": 5432}, "cache": {"ttl": 60}}
    override = {"db!": {"url": "sqlite://"}, "cache~": None}
    assert deep_merge(base, override) == {"db": {"url": "sqlite://"}}


def test_directives_stripped_from_new_values():
    assert deep_merge({}, {"logging": {"level!": "INFO", "file~": 1}}) == {
        "logging": {"level": "INFO"}
    }


def test_list_strategy_per_path():
    merger = Merger(list_strategies={"server.middleware": "append"})
    base = {"server": {"middleware": ["gzip"], "hosts": ["a"]}}
    override = {"server": {"middleware": ["auth"], "hosts": ["b"]}}
    assert merger.merge(base, override) == {
        "server": {"middleware": ["gzip", "auth"], "hosts": ["b"]}
    }


def test_append_directive_overrides_strategy():
    assert deep_merge({"plugins": ["a"]}, {"plugins+": ["b"]}) == {"plugins": ["a", "b"]}


def test_merge_by_key_top_level():
    base = {"services": [{"name": "web", "image": "nginx:1.25", "replicas": 1}]}
    override = {"services": [{"name": "web", "replicas": 3}, {"name": "worker"}]}
    result = deep_merge(base, override, list_strategy="merge_by_key")
    assert result == {
        "services": [
            {"name": "web", "image": "nginx:1.25", "replicas": 3},
            {"name": "worker"},
        ]
    }


def test_three_layers_and_no_mutation():
    defaults = {"app": {"workers": 2, "features": {"a": True}}}
    env = {"app": {"workers": 4}}
    local = {"app": {"features": {"b": True}}}
    result = deep_merge(defaults, env, local)
    assert result == {"app": {"workers": 4, "features": {"a": True, "b": True}}}
    result["app"]["features"]["c"] = True
    assert defaults == {"app": {"workers": 2, "features": {"a": True}}}


def test_invalid_configuration():
    with pytest.raises(ValueError):
        Merger(list_strategy="zip")
    with pytest.raises(TypeError):
        Merger().merge({}, [1])
