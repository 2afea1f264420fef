"""``Tool``: one function the model can call, declared once with a pydantic argument model."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from sandlot.runtimes.session import BashSession, SessionConfig
from sandlot.sandboxes.base import Sandbox
from sandlot.tools.schema import function_schema
from sandlot.tools.tool_result import ToolResult


class NoConfig(BaseModel):
    """Config model of a tool without settings."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class ToolContext:
    """What the tools of one episode work on.

    Attributes:
        sandbox: the started sandbox; every file and command goes through it.
        repo_dir: the repository inside the sandbox (default: ``sandbox.spec.workdir``).
        base_commit: commit ``submit`` diffs against (default: ``HEAD`` of ``repo_dir``).
        shell_name: the sandbox shell session the ``bash`` tool uses.
        session_config: settings of that session when the tools start it.
    """

    sandbox: Sandbox
    repo_dir: str | None = None
    base_commit: str | None = None
    shell_name: str = "default"
    session_config: SessionConfig = field(default_factory=SessionConfig)

    @property
    def repo(self) -> str:
        """``repo_dir`` or the sandbox's workdir."""
        return self.repo_dir or self.sandbox.spec.workdir

    async def shell(self) -> BashSession:
        """The episode's shell session."""
        return await self.sandbox.shell(self.shell_name, config=self.session_config)


class Tool(abc.ABC):
    """A tool: a ``name``, a ``description``, an ``Args`` model (its schema) and ``run``.

    Subclasses set the class attributes and implement :meth:`run`; ``Config`` holds settings
    given in the toolbox configuration (``{"name": "bash", "timeout_s": 60}``).

    Args:
        context: the episode's sandbox and repository.
        config: an instance of ``Config``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]
    Config: ClassVar[type[BaseModel]] = NoConfig

    def __init__(self, context: ToolContext, config: BaseModel | None = None) -> None:
        self.context = context
        self.config = config if config is not None else self.Config()

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The tool's OpenAI function schema."""
        return function_schema(cls.name, cls.description, cls.Args)

    @abc.abstractmethod
    async def run(self, args: Any) -> ToolResult:
        """Run with validated arguments (an ``Args`` instance).

        Raises:
            ToolError: a failure to report to the model.
            SandboxError: the sandbox failed (the toolbox reports it too).
        """
