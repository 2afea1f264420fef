"""Process-wide fake clouds for the contract suite, started on first use, stopped at exit."""

from __future__ import annotations

import atexit
import functools
import os
from typing import TYPE_CHECKING, Any, ClassVar

from requirements import KUBERNETES, SWEREX, VEFAAS, bwrap_missing, module_missing

from fakes.fake_modal import FakeModal
from fakes.fake_vefaas import FakeVefaas
from sandlot.sandboxes.modal import ModalSandbox
from sandlot.sandboxes.registry import register_backend

if TYPE_CHECKING:
    from fakes.fake_kubernetes import FakeKubernetes


@functools.cache
def shared_modal() -> FakeModal:
    fake = FakeModal()
    atexit.register(fake.close)
    return fake


@functools.cache
def shared_vefaas() -> FakeVefaas:
    fake = FakeVefaas().start()
    atexit.register(fake.stop)
    return fake


@functools.cache
def shared_kubernetes() -> FakeKubernetes:
    from fakes.fake_kubernetes import FakeKubernetes  # aiohttp: installed with the client

    fake = FakeKubernetes().start()
    atexit.register(fake.stop)
    return fake


class FakeModalSandbox(ModalSandbox):
    """``ModalSandbox`` whose SDK is :attr:`fake` (the shared fake unless a test sets one)."""

    fake: ClassVar[FakeModal | None] = None

    @classmethod
    def sdk(cls) -> Any:
        return cls.fake or shared_modal()


register_backend("modal-fake", FakeModalSandbox)


def modal_fake_unavailable() -> str | None:
    """Start nothing; give the fake Modal its (fake) token; say why it cannot run."""
    os.environ.setdefault("MODAL_TOKEN_ID", "ak-fake")
    os.environ.setdefault("MODAL_TOKEN_SECRET", "as-fake")
    return bwrap_missing()


def vefaas_fake_unavailable() -> str | None:
    """Why the fake veFaaS cannot run here (bwrap, its SDK, httpx or swe-rex missing), or None."""
    reasons = [
        reason
        for name, install in (
            ("volcenginesdkvefaas", VEFAAS),
            ("httpx", VEFAAS),
            ("swerex.server", SWEREX),
        )
        if (reason := module_missing(name, install)) is not None
    ]
    if (reason := bwrap_missing()) is not None:
        reasons.append(reason)
    return "; ".join(reasons) or None


def kubernetes_fake_unavailable() -> str | None:
    """Why the fake Kubernetes cannot run here (bwrap or the client missing), or None."""
    reasons = [r for r in (module_missing("kubernetes_asyncio", KUBERNETES), bwrap_missing()) if r]
    return "; ".join(reasons) or None
