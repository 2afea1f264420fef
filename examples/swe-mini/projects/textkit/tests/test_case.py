from textkit import camel_case, snake_case


def test_camel_to_snake():
    assert snake_case("camelCase") == "camel_case"


def test_pascal_to_snake():
    assert snake_case("PascalCase") == "pascal_case"


def test_digits_before_capital():
    assert snake_case("version2Beta") == "version2_beta"


def test_already_snake():
    assert snake_case("already_snake") == "already_snake"


def test_snake_to_camel():
    assert camel_case("make_it_camel") == "makeItCamel"
