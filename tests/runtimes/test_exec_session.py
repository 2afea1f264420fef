"""``ExecSession`` specifics: what the exec fallback carries over and how it times out.

Behaviour shared with live shells is in ``tests/sandboxes/contract/test_contract_session.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from runtime_helpers import local_isolation

import sandlot
from sandlot.runtimes import ExecSession, SessionConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
async def session() -> AsyncIterator[ExecSession]:
    async with sandlot.open("local", isolation=local_isolation()) as sb:
        yield ExecSession("fallback", SessionConfig(), sb, sb.spec.workdir)


async def test_unset_variables_stay_unset(session: ExecSession) -> None:
    await session.run("export SANDLOT_G=1")
    await session.run("unset SANDLOT_G")
    assert (await session.run('echo "${SANDLOT_G:-unset}"')).output == "unset\n"


async def test_timeout_returns_partial_output_and_keeps_the_previous_state(
    session: ExecSession,
) -> None:
    await session.run("cd /tmp")
    r = await session.run("cd /; echo started; sleep 60", timeout=0.5)
    assert (r.timed_out, r.exit_code) == (True, 124)
    assert r.output.startswith("started\n")
    assert (await session.run("pwd")).output == "/tmp\n"
