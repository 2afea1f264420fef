"""The exit status a command's wrapper writes in band, as the last line of its stdout.

``remote_shell.exec_argv(report_status=True)`` ends stdout with ``<secret> <status>\\n``; a
platform whose own exit status is unreliable (Podman forgets an ended exec at once with
``exit_command_delay = 0``, docs/docker.md) reads it here instead.
"""

from __future__ import annotations

import re

from sandlot.sandboxes.capped import CappedBuffer

_STATUS = re.compile(rb" ([0-9]{1,3})\n")


class StatusTail:
    """Passes stdout on to ``sink`` but for its last bytes, which may be the status line."""

    def __init__(self, sink: CappedBuffer, secret: bytes) -> None:
        self.sink = sink
        self.secret = secret
        self.keep = len(secret) + len(b" 255\n")
        self.held = b""

    def feed(self, data: bytes) -> None:
        held = self.held + data
        self.sink.feed(held[: -self.keep])
        self.held = held[-self.keep :]

    def end(self) -> int | None:
        """The status of a ``<secret> <status>`` line that ends stdout, else ``None`` (the
        wrapper was killed, or its line was tampered with); the rest goes to ``sink``."""
        at = self.held.rfind(self.secret)
        line = _STATUS.fullmatch(self.held, at + len(self.secret)) if at >= 0 else None
        self.sink.feed(self.held[:at] if line else self.held)
        return int(line[1]) if line else None
