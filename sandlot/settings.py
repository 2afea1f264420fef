"""The environment variables that configure sandlot, each documented once, here.

:func:`settings` reads them from ``os.environ`` at each call (tests and ``--run-id`` set them
while a process runs, so nothing is cached) and validates their types; the module that uses a
value checks its range and says what it means there. An unset or empty variable is ``None``
(or the default shown), so callers keep their own fall-backs (``~/.cache``, a temp directory).

=================================  =======  ========  ===========================================
variable                           type     default   meaning
=================================  =======  ========  ===========================================
``SANDLOT_BACKEND``                name     unset     backend of ``sandlot.open`` and every
                                                      command when none is given (before the
                                                      config file: ``registry.choose_backend``)
``DEPLOYMENT``                     name     unset     uni-agent's word for the backend, read after
                                                      ``SANDLOT_BACKEND``
``SANDLOT_RUN_ID``                 id       unset     the run's id, label of every sandbox it
                                                      starts (``sandlot gc --run-id``); set by
                                                      ``--run-id`` or on first start
``SANDLOT_STATE_DIR``              path     unset     per-user state (the run log); else
                                                      ``$XDG_STATE_HOME/sandlot``
``SANDLOT_MAX_STARTING``           int      64        sandboxes in STARTING per process (0: no cap)
``SANDLOT_CLUSTER_MAX_STARTING``   int      256       ... per Ray cluster (0: no cluster cap)
``SANDLOT_START_ATTEMPTS``         int      3         attempts per start (1: no retry)
``SANDLOT_START_BACKOFF_S``        seconds  2.0       first backoff, doubled per retry
``SANDLOT_START_BACKOFF_MAX_S``    seconds  30.0      backoff ceiling
``SANDLOT_START_BUDGET_S``         seconds  900.0     wall budget of one start's attempts
``SANDLOT_IMAGE_OVERRIDES``        path     unset     JSON/YAML map from canonical image names to
                                                      the names a backend pulls
``SANDLOT_LOCAL_ROOT``             path     unset     ``local`` sandboxes' host directories; else
                                                      ``<tmp>/sandlot-local-<uid>``
``SANDLOT_IMAGE_CACHE``            path     unset     container images pulled for ``local``; else
                                                      ``$XDG_CACHE_HOME/sandlot/images``
``SANDLOT_UNPACK_MAX_RATIO``       int      32        a layer unpacks to at most this many times
                                                      its compressed size (at least 64 MiB; 0: no
                                                      cap): the bound on a decompression bomb
``SANDLOT_UNPACK_MAX_IMAGE_GIB``   GiB      64        an image's layers together (0: no cap)
``SANDLOT_IMAGE_LAYERS``           name     auto      ``mount`` (each layer one squashfs file,
                                                      mounted with FUSE), ``unpack`` (layers
                                                      unpacked into directories), or ``auto``:
                                                      ``mount`` where ``/dev/fuse`` is usable
``SANDLOT_ENV_CACHE``              path     unset     ``local`` test environments; else
                                                      ``~/.cache/sandlot/envs``
``SANDLOT_ENV_INSTALLER``          name     unset     ``uv`` or ``pip`` for those environments;
                                                      unset: ``uv`` when installed
``SANDLOT_DOCKER_API_THREADS``     int      32        worker threads for blocking Docker API calls
``SANDLOT_REPO_MIRROR``            path     unset     git mirrors the rows of ``DEPLOYMENT=local``
                                                      clone from
``SANDLOT_AGENT_CONFIG``           path     unset     ``agent_config.yaml`` of verl's agent loop
``VOLCE_ACCESS_KEY``               secret   unset     ``vefaas``: access key (or
                                                      ``VOLCENGINE_ACCESS_KEY``)
``VOLCE_SECRET_KEY``               secret   unset     ``vefaas``: secret key (or
                                                      ``VOLCENGINE_SECRET_KEY``)
``VOLCE_SESSION_TOKEN``            secret   unset     ``vefaas``: token of temporary (STS)
                                                      credentials (or ``VOLCENGINE_SESSION_TOKEN``,
                                                      the SDK's own name)
``VEFAAS_REGION``                  name     unset     ``vefaas``: region; else ``cn-beijing``
``VEFAAS_FUNCTION_ID``             ids      unset     ``vefaas``: function id(s), comma separated
``VEFAAS_FUNCTION_ROUTE``          routes   unset     ``vefaas``: the functions' HTTP routes,
                                                      paired by position with the ids
=================================  =======  ========  ===========================================

A variable with an alternative name (``VOLCENGINE_*``) is read when the first is unset; the
backend's options override every ``vefaas`` variable. The two STARTING caps are process-wide:
they size the one gate that every sandbox of the process (and, under Ray, of the cluster) starts
through, so they are settings only, never a field of one sandbox's spec, and are checked here
(``>= 0``). The other start limits stay ``None`` when unset so that
:class:`sandlot.sandboxes.scale.starting.StartLimits`, which a spec may override per sandbox,
holds their defaults (the table shows them). Variables that sandlot sets for its own processes
(``SANDLOT_EXEC_ID``, ``SANDLOT_ENV_OVERLAY``, ...) are protocol, not settings, and are not here.
A ``pydantic-settings`` model would do the same; it is not a dependency, and reading a dozen
variables into a pydantic model (already one) takes the few lines of :meth:`Settings.from_env`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, ValidationError

from sandlot.errors import SandlotError


class SettingsError(SandlotError, ValueError):
    """An environment variable holds a value of the wrong type; the message names it."""


class Settings(BaseModel):
    """The ``SANDLOT_*`` environment, typed. Field aliases are the variables' names."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    backend: str | None = Field(None, alias="SANDLOT_BACKEND")
    deployment: str | None = Field(None, alias="DEPLOYMENT")
    run_id: str | None = Field(None, alias="SANDLOT_RUN_ID")
    state_dir: str | None = Field(None, alias="SANDLOT_STATE_DIR")
    max_starting: int = Field(64, ge=0, alias="SANDLOT_MAX_STARTING")
    cluster_max_starting: int = Field(256, ge=0, alias="SANDLOT_CLUSTER_MAX_STARTING")
    max_attempts: int | None = Field(None, alias="SANDLOT_START_ATTEMPTS")
    backoff_s: float | None = Field(None, alias="SANDLOT_START_BACKOFF_S")
    backoff_max_s: float | None = Field(None, alias="SANDLOT_START_BACKOFF_MAX_S")
    budget_s: float | None = Field(None, alias="SANDLOT_START_BUDGET_S")
    image_overrides: str | None = Field(None, alias="SANDLOT_IMAGE_OVERRIDES")
    local_root: str | None = Field(None, alias="SANDLOT_LOCAL_ROOT")
    image_cache: str | None = Field(None, alias="SANDLOT_IMAGE_CACHE")
    unpack_max_ratio: int | None = Field(None, alias="SANDLOT_UNPACK_MAX_RATIO")
    unpack_max_image_gib: float | None = Field(None, alias="SANDLOT_UNPACK_MAX_IMAGE_GIB")
    image_layers: Literal["auto", "mount", "unpack"] = Field("auto", alias="SANDLOT_IMAGE_LAYERS")
    env_cache: str | None = Field(None, alias="SANDLOT_ENV_CACHE")
    env_installer: str | None = Field(None, alias="SANDLOT_ENV_INSTALLER")
    docker_api_threads: int = Field(32, alias="SANDLOT_DOCKER_API_THREADS")
    repo_mirror: str | None = Field(None, alias="SANDLOT_REPO_MIRROR")
    agent_config: str | None = Field(None, alias="SANDLOT_AGENT_CONFIG")
    volce_access_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("VOLCE_ACCESS_KEY", "VOLCENGINE_ACCESS_KEY")
    )
    volce_secret_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("VOLCE_SECRET_KEY", "VOLCENGINE_SECRET_KEY")
    )
    volce_session_token: SecretStr | None = Field(
        None, validation_alias=AliasChoices("VOLCE_SESSION_TOKEN", "VOLCENGINE_SESSION_TOKEN")
    )
    vefaas_region: str | None = Field(None, alias="VEFAAS_REGION")
    vefaas_function_id: str | None = Field(None, alias="VEFAAS_FUNCTION_ID")
    vefaas_function_route: str | None = Field(None, alias="VEFAAS_FUNCTION_ROUTE")

    @classmethod
    def variables(cls) -> list[str]:
        """Every variable read, alternative names included, in the table's order."""
        names: list[str] = []
        for field in cls.model_fields.values():
            choices = field.validation_alias
            if isinstance(choices, AliasChoices):
                names += [str(choice) for choice in choices.choices]
            elif field.alias:
                names.append(field.alias)
        return names

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings in ``environ`` (default ``os.environ``); empty variables count as unset.

        Raises:
            SettingsError: a variable does not parse as its type (the message names it).
        """
        env = os.environ if environ is None else environ
        try:
            values = {name: env[name] for name in cls.variables() if env.get(name)}
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = "; ".join(f"${e['loc'][0]}={e['input']!r}: {e['msg']}" for e in exc.errors())
            raise SettingsError(f"{problems} (fix or unset the variable)") from None


def settings() -> Settings:
    """The current environment's settings (read now; see the module docstring)."""
    return Settings.from_env()
