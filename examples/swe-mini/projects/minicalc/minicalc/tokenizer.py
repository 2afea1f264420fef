"""Split an expression into number and operator tokens."""

from typing import NamedTuple

from minicalc.errors import CalcError
from minicalc.ops import BINARY_OPS

PARENS = "()"


class Token(NamedTuple):
    kind: str  # "num" or "op"
    value: str


def tokenize(text: str) -> list[Token]:
    """Return the tokens of ``text``; whitespace separates tokens and is dropped."""
    tokens: list[Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit() or ch == ".":
            j = i
            while j < len(text) and (text[j].isdigit() or text[j] == "."):
                j += 1
            number = text[i:j]
            if number == "." or number.count(".") > 1:
                raise CalcError(f"malformed number {number!r} at position {i}")
            tokens.append(Token("num", number))
            i = j
        elif ch in BINARY_OPS or ch in PARENS:
            tokens.append(Token("op", ch))
            i += 1
        else:
            raise CalcError(f"unexpected character {ch!r} at position {i}")
    return tokens
