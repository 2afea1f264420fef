"""Contract targets of the cloud backends, run against the local fakes in ``tests/fakes``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import anyio
from fakes.shared import (
    kubernetes_fake_unavailable,
    modal_fake_unavailable,
    shared_kubernetes,
    shared_modal,
    shared_vefaas,
    vefaas_fake_unavailable,
)

from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.modal import ModalSandbox


class _LazyFields(Mapping[str, Any]):
    """The fields pointing at a shared fake, resolved (and the fake started) lazily."""

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self._fields()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields())

    def __len__(self) -> int:
        return len(self._fields())


class _VefaasFields(_LazyFields):
    def _fields(self) -> dict[str, Any]:
        return {"image": "python:3.12", **shared_vefaas().options()}


class _KubernetesFields(_LazyFields):
    def _fields(self) -> dict[str, Any]:
        return {"image": "python:3.12", **shared_kubernetes().options()}


async def _modal_die(sb: Sandbox) -> None:
    assert isinstance(sb, ModalSandbox)
    fake = shared_modal()
    fake.die(next(s for s in fake.sandboxes if s.object_id == sb.backend_id))


async def _vefaas_kill(sb: Sandbox) -> None:
    # Imported here: the vefaas backend needs httpx, which collecting the suite must not.
    from sandlot.sandboxes.vefaas import VefaasSandbox

    assert isinstance(sb, VefaasSandbox) and sb.sandbox_id is not None
    fake = shared_vefaas()
    fake._kill_instance(fake.instances[sb.sandbox_id])


async def _kubernetes_evict(sb: Sandbox) -> None:
    # The kubelet evicts the pod (memory pressure): its processes die, it stays Failed.
    assert sb.backend_id is not None
    await anyio.to_thread.run_sync(shared_kubernetes().evict, sb.backend_id)


def cloud_targets(target_cls: Any) -> list[Any]:
    """``modal-fake``, ``vefaas-fake`` and ``kubernetes-fake`` as ``ContractTarget``
    instances of ``target_cls``."""
    return [
        target_cls(
            id="modal-fake",
            backend="modal-fake",
            fields={"image": "python:3.12"},
            unavailable=modal_fake_unavailable,
            kill_from_outside=_modal_die,
        ),
        # veFaaS egress is per function, not per sandbox: network=False is not enforced.
        target_cls(
            id="vefaas-fake",
            backend="vefaas",
            fields=_VefaasFields(),
            unavailable=vefaas_fake_unavailable,
            kill_from_outside=_vefaas_kill,
            isolated=False,
        ),
        # A fake API server (the real client on the wire) whose pods are bubblewrap jails.
        target_cls(
            id="kubernetes-fake",
            backend="kubernetes",
            fields=_KubernetesFields(),
            unavailable=kubernetes_fake_unavailable,
            kill_from_outside=_kubernetes_evict,
        ),
    ]
