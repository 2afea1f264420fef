"""Credentials and function targets of the ``vefaas`` backend, from options or the variables of
:mod:`sandlot.settings`. Several id/route pairs spread sandboxes across functions (one pair
drawn per sandbox), as uni-agent does to stay under a single function's limits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pydantic import SecretStr

from sandlot.errors import BackendUnavailableError
from sandlot.sandboxes.vefaas.options import VefaasOptions
from sandlot.settings import settings

DEFAULT_REGION = "cn-beijing"


@dataclass(frozen=True)
class Credentials:
    """Volcengine credentials (``ak``/``sk``, and ``token`` for temporary ones) and region."""

    ak: str
    sk: str
    region: str
    token: str | None = None


@dataclass(frozen=True)
class FunctionTarget:
    """One sandbox application: its function id and the HTTP route of its data plane."""

    function_id: str
    route: str


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value else None


def credentials(options: VefaasOptions) -> Credentials:
    """Credentials from ``options``, else the environment.

    Raises:
        BackendUnavailableError: the access or secret key is missing; names the variables.
    """
    env = settings()
    ak = _secret(options.access_key or env.volce_access_key)
    sk = _secret(options.secret_key or env.volce_secret_key)
    if not ak or not sk:
        keys = [k for k, value in (("ACCESS", ak), ("SECRET", sk)) if not value]
        missing = " and ".join(f"VOLCE_{k}_KEY or VOLCENGINE_{k}_KEY" for k in keys)
        raise BackendUnavailableError(
            f"no veFaaS credentials: set {missing} (or the access_key/secret_key options)"
        )
    region = options.region or env.vefaas_region or DEFAULT_REGION
    return Credentials(ak, sk, region, _secret(options.session_token or env.volce_session_token))


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def function_ids(options: VefaasOptions) -> list[str]:
    """The configured function ids, without their routes (enough for the control plane, e.g.
    ``sandlot gc``).

    Raises:
        BackendUnavailableError: no function id is configured; names the variable.
    """
    ids = _split(options.function_id or settings().vefaas_function_id)
    if not ids:
        raise BackendUnavailableError(
            "no veFaaS sandbox function: set VEFAAS_FUNCTION_ID (or the function_id option) to "
            "the sandbox application's function id(s)"
        )
    return ids


def function_targets(options: VefaasOptions) -> list[FunctionTarget]:
    """Every configured function id/route pair.

    Raises:
        BackendUnavailableError: ids or routes missing, or the two lists differ in length.
    """
    ids = function_ids(options)
    routes = _split(options.function_route or settings().vefaas_function_route)
    if not routes:
        raise BackendUnavailableError(
            "no veFaaS sandbox function route: set VEFAAS_FUNCTION_ROUTE (or the function_route "
            "option) to the HTTP route of the sandbox application's function(s)"
        )
    if len(ids) != len(routes):
        raise BackendUnavailableError(
            f"VEFAAS_FUNCTION_ID lists {len(ids)} function(s) but VEFAAS_FUNCTION_ROUTE lists "
            f"{len(routes)} route(s); they are paired by position"
        )
    return [FunctionTarget(i, r) for i, r in zip(ids, routes, strict=True)]


def pick_target(options: VefaasOptions) -> FunctionTarget:
    """One configured pair, drawn uniformly (spreads sandboxes across functions)."""
    return random.choice(function_targets(options))
