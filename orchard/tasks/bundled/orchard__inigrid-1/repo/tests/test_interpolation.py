import pytest

from inigrid import Config, InterpolationDepthError, InterpolationMissingOptionError


def test_same_section_reference():
    cfg = Config.from_string("[paths]\nroot = /srv\ndata = ${root}/data\n")
    assert cfg.get("paths", "data") == "/srv/data"
    assert cfg.get("paths", "data", raw=True) == "${root}/data"


def test_reference_to_default():
    cfg = Config.from_string("[DEFAULT]\nhome = /home/me\n[app]\ncache = ${home}/.cache\n")
    assert cfg.get("app", "cache") == "/home/me/.cache"


def test_section_value_shadows_default_in_reference():
    cfg = Config.from_string(
        "[DEFAULT]\nhome = /home/me\ncache = ${home}/.cache\n[app]\nhome = /opt/app\n"
    )
    assert cfg.get("app", "cache") == "/opt/app/.cache"


def test_cross_section_reference():
    cfg = Config.from_string("[db]\nhost = db.local\n[app]\ndsn = pg://${db:host}/main\n")
    assert cfg.get("app", "dsn") == "pg://db.local/main"


def test_nested_references():
    cfg = Config.from_string("[a]\nx = 1\ny = ${x}${x}\nz = <${y}>\n")
    assert cfg.get("a", "z") == "<11>"


def test_dollar_escape():
    cfg = Config.from_string("[a]\nprice = $$5 and ${cur}\ncur = EUR\n")
    assert cfg.get("a", "price") == "$5 and EUR"


def test_missing_reference():
    cfg = Config.from_string("[a]\nx = ${nope}\n")
    with pytest.raises(InterpolationMissingOptionError) as exc:
        cfg.get("a", "x")
    assert exc.value.reference == "nope"


def test_circular_reference():
    cfg = Config.from_string("[a]\nx = ${y}\ny = ${x}\n")
    with pytest.raises(InterpolationDepthError):
        cfg.get("a", "x")
