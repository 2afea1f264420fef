"""Credentials and function targets of the ``vefaas`` backend, from options or environment.

==========================  ===============================================================
variable                    meaning
==========================  ===============================================================
``VOLCE_ACCESS_KEY``        access key (``VOLCENGINE_ACCESS_KEY`` also accepted)
``VOLCE_SECRET_KEY``        secret key (``VOLCENGINE_SECRET_KEY`` also accepted)
``VOLCE_SESSION_TOKEN``     session token of temporary (STS) credentials
                            (``VOLCENGINE_SESSION_TOKEN``, the SDK's own name, also accepted)
``VEFAAS_REGION``           region, default ``cn-beijing``
``VEFAAS_FUNCTION_ID``      function id, or a comma-separated list
``VEFAAS_FUNCTION_ROUTE``   the function's HTTP route(s), paired by position with the ids
==========================  ===============================================================

Several id/route pairs spread sandboxes across functions (one pair drawn per sandbox), as
uni-agent does to stay under a single function's limits.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from sandlot.errors import BackendUnavailableError
from sandlot.sandboxes.vefaas.options import VefaasOptions

ACCESS_KEY_ENV = ("VOLCE_ACCESS_KEY", "VOLCENGINE_ACCESS_KEY")
SECRET_KEY_ENV = ("VOLCE_SECRET_KEY", "VOLCENGINE_SECRET_KEY")
SESSION_TOKEN_ENV = ("VOLCE_SESSION_TOKEN", "VOLCENGINE_SESSION_TOKEN")
REGION_ENV = "VEFAAS_REGION"
FUNCTION_ID_ENV = "VEFAAS_FUNCTION_ID"
FUNCTION_ROUTE_ENV = "VEFAAS_FUNCTION_ROUTE"
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


def _first_env(names: tuple[str, ...]) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def credentials(options: VefaasOptions) -> Credentials:
    """Credentials from ``options``, else the environment.

    Raises:
        BackendUnavailableError: the access or secret key is missing; names the variables.
    """
    ak = options.access_key.get_secret_value() if options.access_key else _first_env(ACCESS_KEY_ENV)
    sk = options.secret_key.get_secret_value() if options.secret_key else _first_env(SECRET_KEY_ENV)
    missing = []
    if not ak:
        missing.append(" or ".join(ACCESS_KEY_ENV))
    if not sk:
        missing.append(" or ".join(SECRET_KEY_ENV))
    if missing or ak is None or sk is None:
        raise BackendUnavailableError(
            f"no veFaaS credentials: set {' and '.join(missing)} (or the access_key/secret_key "
            "options)"
        )
    region = options.region or os.environ.get(REGION_ENV) or DEFAULT_REGION
    token = options.session_token
    return Credentials(
        ak, sk, region, token.get_secret_value() if token else _first_env(SESSION_TOKEN_ENV)
    )


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def function_ids(options: VefaasOptions) -> list[str]:
    """The configured function ids, without their routes (enough for the control plane, e.g.
    ``sandlot gc``).

    Raises:
        BackendUnavailableError: no function id is configured; names the variable.
    """
    ids = _split(options.function_id or os.environ.get(FUNCTION_ID_ENV))
    if not ids:
        raise BackendUnavailableError(
            f"no veFaaS sandbox function: set {FUNCTION_ID_ENV} (or the function_id option) to "
            "the sandbox application's function id(s)"
        )
    return ids


def function_targets(options: VefaasOptions) -> list[FunctionTarget]:
    """Every configured function id/route pair.

    Raises:
        BackendUnavailableError: ids or routes missing, or the two lists differ in length.
    """
    ids = function_ids(options)
    routes = _split(options.function_route or os.environ.get(FUNCTION_ROUTE_ENV))
    if not routes:
        raise BackendUnavailableError(
            f"no veFaaS sandbox function route: set {FUNCTION_ROUTE_ENV} (or the function_route "
            "option) to the HTTP route of the sandbox application's function(s)"
        )
    if len(ids) != len(routes):
        raise BackendUnavailableError(
            f"{FUNCTION_ID_ENV} lists {len(ids)} function(s) but {FUNCTION_ROUTE_ENV} lists "
            f"{len(routes)} route(s); they are paired by position"
        )
    return [FunctionTarget(i, r) for i, r in zip(ids, routes, strict=True)]


def pick_target(options: VefaasOptions) -> FunctionTarget:
    """One configured pair, drawn uniformly (spreads sandboxes across functions)."""
    return random.choice(function_targets(options))
