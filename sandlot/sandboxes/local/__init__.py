"""The ``local`` backend: commands in bubblewrap jails on this machine."""

from sandlot.sandboxes.local.options import LocalOptions
from sandlot.sandboxes.local.sandbox import LocalSandbox

__all__ = ["LocalOptions", "LocalSandbox"]
