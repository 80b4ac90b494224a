from slugkit import fold, normalize_whitespace


def test_fold_strips_accents():
    assert fold("Crème brûlée à la mode") == "Creme brulee a la mode"


def test_fold_special_letters():
    assert fold("Straße Ærøskøbing Łódź") == "Strasse AEroskobing Lodz"


def test_fold_compatibility_characters():
    assert fold("ﬁnale²") == "finale2"


def test_fold_drops_unmappable():
    assert fold("tea 茶 time") == "tea  time"


def test_normalize_whitespace():
    assert normalize_whitespace("  a\tb\n\u00a0c  ") == "a b c"
