"""What a pull shows while it transfers: layers and bytes, on stderr.

skopeo shows no sizes on a pipe, so the progress is read from the cache: while ``skopeo copy``
runs, a thread looks every :data:`POLL_S` seconds at the blobs it has finished (renamed into
the shared blob directory under their digests) and the one it is writing (``oci-put-blob*``
in the pull's OCI layout: containers/image's ``oci_dest.go`` ``PutBlob`` writes there first),
and counts the layers skopeo has named ("Copying blob sha256:..." on its stdout). The total is
not known before the copy (reading the manifest first would cost a registry request, which
Docker Hub counts against its pull limit).

A :class:`PullObserver` receives the events. The default one (:class:`LineObserver`) writes a
line per finished layer on a terminal and one line per image elsewhere (logs of batch jobs stay
short); ``sandlot image pull`` shows a rich progress line per image on a terminal.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol, TextIO

POLL_S = 0.5
"""Seconds between two looks at a running pull's files."""


class PullObserver(Protocol):
    """Receives the progress of pulls; its methods are called from pulling threads."""

    def started(self, image: str) -> None:
        """A fetch of ``image`` began."""

    def advanced(self, image: str, transferred: int, layers_done: int, layers: int) -> None:
        """``transferred`` bytes of ``image``'s blobs came in so far; ``layers_done`` of the
        ``layers`` layer blobs skopeo has named so far are in the cache (those cached before
        included)."""

    def finished(self, image: str, transferred: int, seconds: float) -> None:
        """The fetch of ``image`` succeeded: ``transferred`` bytes in ``seconds``."""


def human_size(size: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


class LineObserver:
    """Plain lines on ``stream`` (default: stderr): on a terminal, one when a pull starts and
    one per finished layer; elsewhere only the line of each finished image."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._shown: dict[str, int] = {}  # image -> layers reported done

    @property
    def stream(self) -> TextIO:
        """Where the lines go (stderr as it is when written, unless one was given)."""
        return self._stream or sys.stderr

    def _tty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def _say(self, line: str) -> None:
        with self._lock:
            print(line, file=self.stream, flush=True)

    def started(self, image: str) -> None:
        self._shown[image] = 0
        if self._tty():
            self._say(f"pulling {image}")

    def advanced(self, image: str, transferred: int, layers_done: int, layers: int) -> None:
        if layers_done <= self._shown.get(image, 0):
            return
        self._shown[image] = layers_done
        if self._tty():
            self._say(
                f"  {image}: {layers_done}/{layers} layers, {human_size(transferred)} transferred"
            )

    def finished(self, image: str, transferred: int, seconds: float) -> None:
        self._shown.pop(image, None)
        self._say(f"pulled {image}: {human_size(transferred)} transferred in {seconds:.1f} s")


_observer: PullObserver | None = LineObserver()


def observer() -> PullObserver | None:
    """The observer of pulls that name none (those a sandbox start triggers)."""
    return _observer


def set_observer(new: PullObserver | None) -> PullObserver | None:
    """Make ``new`` the observer of pulls that name none (``None``: silent); returns the old
    one."""
    global _observer
    old, _observer = _observer, new
    return old


@contextmanager
def watching(
    blobs: Path, layout: Path, layers: list[str], image: str, observer: PullObserver | None
) -> Iterator[None]:
    """Tell ``observer`` (if any) the progress of the copy running inside the block.

    Args:
        blobs: the shared blob directory (``<cache>/blobs/sha256``), where finished blobs land.
        layout: the pull's OCI layout directory, where skopeo writes the blob in transfer.
        layers: the digests of the layers skopeo has named so far (another thread appends).
        image: the name reported.
        observer: who is told; ``None``: nobody (the block just runs).
    """
    if observer is None:
        yield
        return
    had = {p.name for p in blobs.iterdir()}
    stop = threading.Event()

    def look() -> None:
        transferred = done = 0
        named = list(layers)
        for digest in named:
            blob = blobs / digest.partition(":")[2]
            with suppress(OSError):  # not there (yet)
                size = blob.stat().st_size
                done += 1
                transferred += size if blob.name not in had else 0
        for partial in layout.glob("oci-put-blob*"):
            with suppress(OSError):  # renamed away while we looked
                transferred += partial.stat().st_size
        observer.advanced(image, transferred, done, len(named))

    def poll() -> None:
        while not stop.wait(POLL_S):
            look()

    thread = threading.Thread(target=poll, name=f"pull-progress {image}", daemon=True)
    thread.start()
    try:
        yield
        look()
    finally:
        stop.set()
        thread.join()
