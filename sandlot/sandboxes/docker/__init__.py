"""The ``docker`` backend: sandboxes in containers of a Docker Engine or of Podman's Docker API.

Needs the ``docker`` SDK (``pip install 'sandlot[docker]'``), imported only when a sandbox
starts, so this package imports without it.
"""

from sandlot.sandboxes.docker.engine import EngineUnreachableError, api_limiter
from sandlot.sandboxes.docker.options import DockerOptions, RegistryAuth
from sandlot.sandboxes.docker.sandbox import DockerSandbox

__all__ = [
    "DockerOptions",
    "DockerSandbox",
    "EngineUnreachableError",
    "RegistryAuth",
    "api_limiter",
]
