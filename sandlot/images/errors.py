"""The error of a failed image pull or unpack."""

from __future__ import annotations

from sandlot.errors import SandboxStartError


class ImageError(SandboxStartError):
    """An image could not be pulled, verified or unpacked; nothing of it was cached.

    ``retryable`` is ``True`` for failures a repeat can cure (a connection dropped, a registry
    answering 5xx) and ``False`` for the rest (unknown image, refused credentials, a blob whose
    digest does not match).
    """
