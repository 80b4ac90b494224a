from unitconv import tokenize


def test_tokenize():
    assert tokenize("kg*m / s^-2") == [
        ("symbol", "kg"), ("op", "*"), ("symbol", "m"), ("op", "/"), ("symbol", "s"),
        ("op", "^"), ("number", "-2")]


def test_tokenize_parentheses_and_one():
    assert [t for _, t in tokenize("1/(h*m)")] == ["1", "/", "(", "h", "*", "m", ")"]
