"""sandlot's error root and the error hierarchy of the sandbox layer.

Every public error of the package derives from :class:`SandlotError` (each layer's own root,
e.g. ``DatasetError`` or ``RolloutError``, sits under it, mixed with the stdlib class callers
already catch, such as ``ValueError``), so ``except sandlot.SandlotError`` catches whatever
sandlot raises on purpose. Every infrastructure failure raised by a backend is a
:class:`SandboxError`. Each sandbox error says whether retrying the same operation can help
(``retryable``), so schedulers can decide without parsing messages. A command that exits
non-zero is *not* an error: it is an ``ExecResult``.
"""

from __future__ import annotations


class SandlotError(Exception):
    """Root of every public sandlot error; catch it to handle whatever sandlot raises."""


class SandboxError(SandlotError):
    """Base class of every sandbox failure.

    Attributes:
        retryable: ``True`` when the same call may succeed if repeated (capacity, transient
            network); ``False`` for permanent faults (bad image, bad configuration).
    """

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class BackendNotFoundError(SandboxError, ValueError):
    """The requested backend name is not registered."""


class BackendUnavailableError(SandboxError):
    """The backend exists but cannot run here (missing SDK extra or system tool)."""


class SandboxStartError(SandboxError):
    """The sandbox could not be created or started."""


class SandboxSetupError(SandboxStartError):
    """A setup step (``post_setup_cmd``, an environment step) exited non-zero or timed out.

    Attributes:
        step: which step (``"post_setup_cmd"``, ``"environment install"``, ...).
        command: the setup command that failed.
        exit_code: its exit status (124 on timeout).
        output_tail: the last lines of its combined output.
    """

    def __init__(
        self, command: str, exit_code: int, output_tail: str, *, step: str = "post_setup_cmd"
    ) -> None:
        self.command = command
        self.exit_code = exit_code
        self.output_tail = output_tail
        self.step = step
        super().__init__(
            f"{step} failed with exit code {exit_code}: {command!r}\n"
            f"--- last output ---\n{output_tail}",
            retryable=False,
        )


class EnvironmentBuildError(SandboxStartError):
    """An environment recipe could not be provided (missing interpreter, a package that does
    not install); nothing half-built is kept. Not retryable: the same recipe fails again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class SandboxDeadError(SandboxError):
    """The sandbox is gone (closed, killed from outside, or its lifetime expired)."""


class SandboxFileError(SandboxError):
    """A file operation failed inside a live sandbox (missing path, not writable, ...)."""
