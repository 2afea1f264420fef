"""The ``vefaas`` backend: sandboxes on Volcengine veFaaS (``pip install 'sandlot[vefaas]'``).

The SDK is imported only when a sandbox starts, so this package imports without it.
"""

from sandlot.sandboxes.vefaas.options import VefaasOptions
from sandlot.sandboxes.vefaas.sandbox import VefaasSandbox

__all__ = ["VefaasOptions", "VefaasSandbox"]
