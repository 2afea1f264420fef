"""The backend's clients share one SSL context per set of TLS settings: ``kubernetes_asyncio``
makes one per client (and per watch), each parsing the system's CA bundle."""

from __future__ import annotations

import ssl

import pytest
from requirements import importable, needs

pytestmark = [pytest.mark.anyio, needs(importable("kubernetes_asyncio", "kubernetes"))]


async def test_clients_and_watches_of_one_configuration_load_the_ca_bundle_once(
    monkeypatch: pytest.MonkeyPatch, ssl_contexts_made: list[ssl.SSLContext]
) -> None:
    from kubernetes_asyncio import client

    from sandlot.sandboxes.kubernetes import client as kube

    made = ssl_contexts_made
    monkeypatch.setattr(kube, "_ssl_contexts", {})
    config = client.Configuration(host="https://cluster.example:6443")
    insecure = client.Configuration(host="https://cluster.example:6443")
    insecure.verify_ssl = False
    clients = [kube.new_client(config) for _ in range(3)]
    clients.append(kube.new_client(config, websocket=True))
    watches = [kube.new_watch() for _ in range(2)]
    # One: the watches' (default) configuration has the same TLS settings as this one.
    assert len(made) == 1
    clients.append(kube.new_client(insecure))
    assert len(made) == 2  # other TLS settings: a context of their own
    assert made[1].verify_mode == ssl.CERT_NONE
    assert made[0].verify_mode == ssl.CERT_REQUIRED  # not touched by the insecure client
    plain = client.ApiClient(config)  # outside new_client: the client's own context, as before
    assert len(made) == 3
    for c in [*clients, plain]:
        await c.close()
    for w in watches:
        await w.close()
