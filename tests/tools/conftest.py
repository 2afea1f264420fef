"""Fixtures for the tool tests: a started local sandbox and a toolbox over it."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest

import sandlot
from sandlot import Sandbox
from sandlot.tools import Toolbox, ToolContext


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    isolation = "bwrap" if shutil.which("bwrap") else "none"
    async with sandlot.open("local", isolation=isolation) as sb:
        yield sb


@pytest.fixture
def toolbox(sandbox: Sandbox) -> Toolbox:
    return Toolbox.from_config(
        ["bash", "str_replace_editor", "submit", "finish"], context=ToolContext(sandbox)
    )
