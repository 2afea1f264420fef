"""The sandbox protocol and its backends.

The protocol is the modules here; the rooms around it each answer one question (``setups/``:
set an instance up once, fork it n times; ``scale/``: start thousands at once; ``shared/``: what
backends inherit; one folder per backend). ``docs/architecture.md`` tables them.
"""

from sandlot.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    EnvironmentBuildError,
    SandboxDeadError,
    SandboxError,
    SandboxFileError,
    SandboxSetupError,
    SandboxStartError,
)
from sandlot.result import TIMEOUT_EXIT_CODE, ExecResult
from sandlot.sandboxes.archive import DownloadLimitError, DownloadReport
from sandlot.sandboxes.base import Command, Sandbox
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.open import open
from sandlot.sandboxes.registry import available_backends, get_backend, register_backend
from sandlot.sandboxes.setups.group import open_group
from sandlot.sandboxes.snapshot import Snapshot
from sandlot.sandboxes.spec import SandboxSpec

__all__ = [
    "TIMEOUT_EXIT_CODE",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "Command",
    "DownloadLimitError",
    "DownloadReport",
    "EnvironmentBuildError",
    "EnvironmentRecipe",
    "ExecResult",
    "Sandbox",
    "SandboxDeadError",
    "SandboxError",
    "SandboxFileError",
    "SandboxSetupError",
    "SandboxSpec",
    "SandboxStartError",
    "Snapshot",
    "available_backends",
    "get_backend",
    "open",
    "open_group",
    "register_backend",
]
