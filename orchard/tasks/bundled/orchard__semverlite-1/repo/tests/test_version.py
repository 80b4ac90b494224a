import pytest
from semverlite import InvalidVersion, Version, compare, parse_version


def test_basic_parse():
    v = parse_version("1.2.3")
    assert (v.major, v.minor, v.patch) == (1, 2, 3)
    assert v.prerelease == ()
    assert str(v) == "1.2.3"


def test_parse_prerelease_and_build():
    v = parse_version("v2.0.0-rc.1+build.5")
    assert v.prerelease == ("rc", 1)
    assert v.build == ("build", "5")
    assert str(v) == "2.0.0-rc.1+build.5"


@pytest.mark.parametrize(
    "text",
    ["1.2", "1.2.3.4", "01.2.3", "1.2.3-", "1.2.3-01", "a.b.c", ""],
    ids=["short", "long", "leading-zero", "empty-pre", "pre-leading-zero", "letters", "empty"],
)
def test_invalid_versions(text):
    with pytest.raises(InvalidVersion):
        parse_version(text)


def test_prerelease_ordering():
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
    ]
    versions = [parse_version(v) for v in ordered]
    assert sorted(reversed(versions)) == versions


def test_build_metadata_ignored_for_precedence():
    assert compare("1.0.0+a", "1.0.0+b") == 0
    assert parse_version("1.0.0+a") == parse_version("1.0.0")
    assert len({parse_version("1.0.0+a"), parse_version("1.0.0")}) == 1


def test_compare_numeric_components():
    assert compare("1.10.0", "1.9.0") == 1
    assert compare("2.0.0", "10.0.0") == -1


@pytest.mark.parametrize(
    "start,part,expected",
    [
        ("1.2.3", "major", "2.0.0"),
        ("1.2.3", "minor", "1.3.0"),
        ("1.2.3", "patch", "1.2.4"),
        ("1.2.0-rc.1", "minor", "1.2.0"),
        ("1.2.3-rc.1", "patch", "1.2.3"),
    ],
)
def test_bump(start, part, expected):
    assert str(parse_version(start).bump(part)) == expected


def test_bump_unknown_part():
    with pytest.raises(ValueError):
        Version(1, 0, 0).bump("build")
