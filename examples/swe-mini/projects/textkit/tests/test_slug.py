from textkit import slugify


def test_punctuation_becomes_separator():
    assert slugify("Hello, World!") == "hello-world"


def test_edges_are_stripped():
    assert slugify("  --Already a slug--  ") == "already-a-slug"


def test_custom_separator():
    assert slugify("Read the Docs", sep="_") == "read_the_docs"


def test_digits_are_kept():
    assert slugify("Top 10 tips") == "top-10-tips"
