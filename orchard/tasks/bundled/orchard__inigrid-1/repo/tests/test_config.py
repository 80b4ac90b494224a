import pytest

from inigrid import Config, DuplicateSectionError, NoOptionError, NoSectionError

TEXT = """\
[DEFAULT]
log_level = info
timeout = 30

[server]
host = example.org
port = 8080
debug = yes
timeout = 5

[client]
ratio = 0.75
"""


@pytest.fixture
def cfg():
    return Config.from_string(TEXT)


def test_default_fallback_and_override(cfg):
    assert cfg.get("client", "log_level") == "info"
    assert cfg.get("client", "timeout") == "30"
    assert cfg.get("server", "timeout") == "5"


def test_typed_getters(cfg):
    assert cfg.getint("server", "port") == 8080
    assert cfg.getboolean("server", "debug") is True
    assert cfg.getfloat("client", "ratio") == 0.75
    with pytest.raises(ValueError):
        cfg.getboolean("server", "host")


def test_option_names_are_case_insensitive(cfg):
    assert cfg.get("server", "HOST") == "example.org"
    assert cfg.has_option("server", "Port")


def test_missing_section_and_option(cfg):
    with pytest.raises(NoSectionError):
        cfg.get("nope", "x")
    with pytest.raises(NoOptionError):
        cfg.get("server", "nope")
    assert cfg.get("server", "nope", fallback=None) is None
    assert cfg.getint("nope", "x", fallback=7) == 7


def test_options_include_defaults(cfg):
    assert cfg.options("server") == ["host", "port", "debug", "timeout", "log_level"]


def test_set_add_section_and_roundtrip(cfg):
    cfg.add_section("extra")
    cfg.set("extra", "Note", "two\nlines")
    with pytest.raises(DuplicateSectionError):
        cfg.add_section("server")
    again = Config.from_string(cfg.to_string())
    assert again.get("extra", "note") == "two\nlines"
    assert again.items("server") == cfg.items("server")
