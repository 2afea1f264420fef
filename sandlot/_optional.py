"""Lazy imports of optional SDKs, with errors that name the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from sandlot.errors import BackendUnavailableError


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``; if it is missing, say which ``sandlot`` extra provides it.

    Raises:
        BackendUnavailableError: the module (or one of its dependencies) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"{module} is not installed ({exc}); install it with: pip install 'sandlot[{extra}]'"
        ) from exc
