"""URL slugs."""

import re


def slugify(text: str, sep: str = "-") -> str:
    """Return a lowercase ASCII slug of ``text``: ``"Hello, World!"`` -> ``"hello-world"``."""
    text = text.lower()
    text = re.sub(r"[^a-z0-9]+", sep, text)
    return text.strip(sep)
