"""The ``modal`` backend: sandboxes on Modal (``pip install 'sandlot[modal]'``).

The SDK is imported only when a sandbox starts, so this package imports without it.
"""

from sandlot.sandboxes.modal.options import ModalOptions
from sandlot.sandboxes.modal.sandbox import ModalSandbox

__all__ = ["ModalOptions", "ModalSandbox"]
