"""sandlot: pluggable async sandboxes and SWE-bench style rewards for software-engineering agents.

async with sandlot.open("local", post_setup_cmd="...") as sb:
    r = await sb.exec("python -c 'print(1+1)'", timeout=10)
"""

from sandlot.errors import SandlotError
from sandlot.sandboxes import (
    TIMEOUT_EXIT_CODE,
    BackendNotFoundError,
    BackendUnavailableError,
    EnvironmentBuildError,
    EnvironmentRecipe,
    ExecResult,
    Sandbox,
    SandboxDeadError,
    SandboxError,
    SandboxFileError,
    SandboxSetupError,
    SandboxSpec,
    SandboxStartError,
    Snapshot,
    available_backends,
    get_backend,
    open,
    open_group,
    register_backend,
)

__version__ = "0.1.0"

__all__ = [
    "TIMEOUT_EXIT_CODE",
    "BackendNotFoundError",
    "BackendUnavailableError",
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
    "SandlotError",
    "Snapshot",
    "__version__",
    "available_backends",
    "get_backend",
    "open",
    "open_group",
    "register_backend",
]
