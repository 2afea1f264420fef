"""The ``kubernetes`` backend: one pod per sandbox (``pip install 'sandlot[kubernetes]'``).

The client (``kubernetes_asyncio``) is imported only when a sandbox starts, so this package
imports without it.
"""

from sandlot.sandboxes.kubernetes.options import KubernetesOptions
from sandlot.sandboxes.kubernetes.sandbox import KubernetesSandbox

__all__ = ["KubernetesOptions", "KubernetesSandbox"]
