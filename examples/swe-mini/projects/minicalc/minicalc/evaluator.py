"""Evaluate a token stream by precedence climbing."""

from minicalc.errors import CalcError
from minicalc.ops import BINARY_OPS
from minicalc.tokenizer import Token, tokenize


def evaluate(text: str) -> float:
    """Return the value of the expression ``text``."""
    parser = _Parser(tokenize(text))
    value = parser.expression(0)
    leftover = parser.peek()
    if leftover is not None:
        raise CalcError(f"unexpected {leftover.value!r} after the expression")
    return value


def _number(text: str) -> float:
    return float(text) if "." in text else int(text)


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def advance(self) -> Token:
        token = self.peek()
        if token is None:
            raise CalcError("unexpected end of expression")
        self.pos += 1
        return token

    def expression(self, min_precedence: int) -> float:
        left = self.operand()
        while True:
            token = self.peek()
            if token is None or token.value not in BINARY_OPS:
                return left
            precedence, apply = BINARY_OPS[token.value]
            if precedence < min_precedence:
                return left
            self.advance()
            right = self.expression(precedence + 1)
            left = apply(left, right)

    def operand(self) -> float:
        token = self.advance()
        if token.kind == "num":
            return _number(token.value)
        if token.value == "(":
            value = self.expression(0)
            if self.advance().value != ")":
                raise CalcError("expected ')'")
            return value
        raise CalcError(f"unexpected {token.value!r}")
