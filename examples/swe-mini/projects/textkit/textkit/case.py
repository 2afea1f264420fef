"""Identifier case conversions."""


def snake_case(name: str) -> str:
    """``"camelCase"`` -> ``"camel_case"``."""
    out: list[str] = []
    for i, ch in enumerate(name):
        if ch.isupper() and i > 0 and name[i - 1] != "_":
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def camel_case(name: str) -> str:
    """``"snake_case"`` -> ``"snakeCase"``."""
    head, *rest = name.split("_")
    return head.lower() + "".join(part.capitalize() for part in rest)
