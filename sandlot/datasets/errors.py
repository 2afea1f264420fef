"""``DatasetError``: the one root of the errors raised by ``sandlot.datasets``.

It is a ``ValueError`` (what callers of data code catch). Errors about a record of a file carry
its location (:class:`DatasetError` itself); the others are told in one message
(:class:`DatasetMessageError` and its subclasses: unknown backend, image name, test spec,
prompt leak, source field, uni-agent row, local backend). ``OutputDirError`` stays an
``OSError``: it is about the file system.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from sandlot.errors import SandlotError


class DatasetError(SandlotError, ValueError):
    """A dataset file or one of its records is invalid.

    Attributes:
        source: the dataset file.
        problem: what is wrong, without the location.
        where: the record's position: ``"line 3"`` (JSONL, 1-based), ``"index 0"`` (JSON list,
            0-based), ``"key 'x'"`` (JSON mapping), ``"row 7"`` (parquet, 0-based); ``None`` for
            errors about the whole file.
        instance_id: the record's ``instance_id`` when known.
        fields: the offending fields, empty when the problem is not about one field.
    """

    def __init__(
        self,
        source: str | os.PathLike[str],
        problem: str,
        *,
        where: str | None = None,
        instance_id: str | None = None,
        fields: tuple[str, ...] = (),
    ) -> None:
        self.source = str(source)
        self.problem = problem
        self.where = where
        self.instance_id = instance_id
        self.fields = fields
        location = self.source if where is None else f"{self.source}, {where}"
        if instance_id is not None:
            location += f" (instance_id {instance_id!r})"
        super().__init__(f"{location}: {problem}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Keyword-only arguments are not in ``self.args``; keep the error picklable (workers).
        rebuild = functools.partial(
            type(self),
            self.source,
            self.problem,
            where=self.where,
            instance_id=self.instance_id,
            fields=self.fields,
        )
        return rebuild, ()


class DatasetMessageError(DatasetError):
    """A dataset problem without a file position; ``problem`` is the whole message."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.source = ""
        self.problem = message
        self.where = None
        self.instance_id = None
        self.fields = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (self.problem,)
