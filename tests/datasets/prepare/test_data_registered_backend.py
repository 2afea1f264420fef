"""A row names any registered backend (built in, an entry point of ``sandlot.backends``, or
``register_backend``), not one of a closed list; an unknown name is an error listing them."""

from __future__ import annotations

import re

import pytest
from dataprep_support import ROOT
from pydantic import ValidationError

from sandlot.datasets.rows import SandboxHints, TaskRow
from sandlot.rollout.rows import load_rows

SWE_MINI = ROOT / "examples" / "swe-mini" / "instances.jsonl"


def test_a_row_names_a_registered_backend(fakecloud: str) -> None:
    [row, *_] = load_rows(SWE_MINI, backend=fakecloud, image="python:3.12")
    assert row.extra_info.tools_kwargs.env.sandbox.backend == "fakecloud"
    again = TaskRow.from_record(row.to_record())  # as written to parquet and read back
    assert again.extra_info.tools_kwargs.env.sandbox.backend == "fakecloud"
    assert SandboxHints(backend=" FakeCloud ").backend == "fakecloud"


def test_an_unknown_backend_is_named_with_the_registered_ones(fakecloud: str) -> None:
    with pytest.raises(ValidationError) as err:
        SandboxHints(backend="nocloud")
    message = str(err.value)
    assert "backend" in message and "unknown sandbox backend 'nocloud'" in message
    listed = re.search(r"known backends: ((?:[\w-]+, )*[\w-]+)", message)
    assert listed, message
    assert {"docker", "fakecloud", "local", "modal", "vefaas"} <= set(listed[1].split(", "))
    assert "sandlot.backends" in message  # where a third party registers
