"""``agent_config.yaml``: how an episode runs, validated when it is loaded.

One file serves ``sandlot rollout`` and training. Its blocks (every key optional)::

    sandbox:                      # where episodes run
      backend: local              # the one line that moves a run to docker, modal or vefaas;
                                  # --backend, $SANDLOT_BACKEND, then $DEPLOYMENT override it
      options:                    # each backend's own options (its Options model), by name;
        modal: {app_name: my-app} # only the active backend's block is used
      spec: {timeout_s: 3600, memory_mb: 4096}   # SandboxSpec defaults; the row's own
                                  # environment (image, post_setup_cmd, env, workdir) wins
    tools: [bash, str_replace_editor, submit]    # the Toolbox config
    tool_parser: hermes           # reads tool calls from text when the model has no native ones
    reasoning_opened: false       # the chat template opens <think> (DeepSeek-R1, Qwen3 thinking
                                  # checkpoints): a reply without </think> is all reasoning.
                                  # Calls inside <think>...</think> are never executed.
    prompt: {system: null, user: null}           # templates over the instance's fields
    interaction: {max_turns: 50, action_timeout: 180, timeout_budget: 3,
                  max_total_tokens: 65536, max_observation_chars: 20000}
    reward: {mode: fresh, eval_timeout: 1800}
    concurrency: 8
    client:                       # the OpenAI-compatible model client (sandlot rollout)
      request_timeout_s: 600      # one HTTP request, connect to last byte
      retry_budget_s: 300         # a turn's failed requests are retried this long (a model
                                  # server restart); the episode waits, nothing is rerun
      backoff_s: 1                # first wait's bound; doubles up to max_backoff_s, full jitter
      max_backoff_s: 30
    generation:                   # how each turn is sampled, the same in rollout and training
      response_length: 32768      # (sandlot.rollout.generation): max_tokens, temperature,
      temperature: 1.0            # top_p, stop, chat_template_kwargs, extra_body
      chat_template_kwargs: {enable_thinking: false}

The layout follows uni-agent's ``agent_config.yaml`` (``interaction``, ``tools``,
``tool_parser``, ``reward``, ``concurrency``), with the sandbox described by sandlot's
backend-neutral ``SandboxSpec``.
"""

from __future__ import annotations

import difflib
import os
import string
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandlot.datasets.prompts import PROMPT_FIELDS
from sandlot.errors import BackendNotFoundError, SandlotError
from sandlot.rollout.generation import GenerationConfig
from sandlot.sandboxes.registry import (
    available_backends,
    choose_backend,
    get_backend,
)
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.tools.parsers import PARSERS
from sandlot.tools.toolbox import DEFAULT_TOOLS, TOOLS

# The row decides these; a config default for them would be silently overridden.
_ROW_FIELDS = frozenset({"image", "workdir", "environment"})


class ConfigError(SandlotError, ValueError):
    """``agent_config.yaml`` is unreadable or invalid; the message names the key path."""


class SandboxConfig(BaseModel):
    """The ``sandbox`` block: backend, per-backend options, ``SandboxSpec`` defaults."""

    model_config = ConfigDict(extra="forbid")

    backend: str = "local"
    options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    spec: dict[str, Any] = Field(default_factory=dict)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        name = value.strip().lower()
        if name not in available_backends():
            known = ", ".join(available_backends())
            raise ValueError(f"unknown backend {value!r}; allowed: {known}")
        return name

    @field_validator("spec")
    @classmethod
    def _spec_defaults(cls, value: dict[str, Any]) -> dict[str, Any]:
        row_owned = sorted(_ROW_FIELDS & set(value))
        if row_owned:
            raise ValueError(
                f"{', '.join(row_owned)}: set by each row, not by the config; "
                f"allowed here: {', '.join(sorted(set(SandboxSpec.model_fields) - _ROW_FIELDS))}"
            )
        allowed = sorted(set(SandboxSpec.model_fields) - _ROW_FIELDS)
        unknown = sorted(set(value) - set(SandboxSpec.model_fields))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: {unknown_key_message(unknown[0], allowed)}")
        SandboxSpec.model_validate(value)  # bad values fail at load
        return value

    def file_backend(self) -> str | None:
        """``backend`` as the file sets it; ``None`` when the file says nothing (``local`` is
        then :func:`~sandlot.sandboxes.registry.choose_backend`'s default, not the file's)."""
        return self.backend if "backend" in self.model_fields_set else None

    def resolved_backend(self) -> str:
        """:func:`~sandlot.sandboxes.registry.choose_backend` without an argument:
        ``$SANDLOT_BACKEND``, then ``$DEPLOYMENT``, then this block's ``backend``, then
        ``local``.

        Raises:
            ConfigError: the variable names no backend (the message says which, lists the
                known ones and the fix).
        """
        try:
            return choose_backend(config=self.file_backend()).name
        except BackendNotFoundError as exc:
            raise ConfigError(str(exc)) from None

    def options_for(self, backend: str) -> BaseModel:
        """``backend``'s options from the ``options`` block, validated by its ``Options`` model.

        Raises:
            ConfigError: the block has keys the backend does not know (names them), or
                ``backend`` is not a backend (names the known ones).
        """
        if backend not in available_backends():
            known = ", ".join(available_backends())
            raise ConfigError(f"unknown backend {backend!r}; allowed: {known}")
        cls = get_backend(backend)
        try:
            return cls.Options.model_validate(self.options.get(backend, {}))
        except ValidationError as exc:
            where = f"sandbox.options.{backend}"
            raise ConfigError(_describe(exc, cls.Options, prefix=where)) from None


class PromptConfig(BaseModel):
    """Optional templates replacing the row's messages: ``str.format`` over the instance
    fields of :data:`~sandlot.datasets.prompts.PROMPT_FIELDS` (``{problem_statement}``,
    ``{repo}``, ``{instance_id}``, ``{workdir}``, ``{base_commit}``); never the gold patch, the
    test patch or the test lists."""

    model_config = ConfigDict(extra="forbid")

    system: str | None = None
    user: str | None = None

    @field_validator("system", "user")
    @classmethod
    def _allowed_fields(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
        except ValueError as exc:
            raise ValueError(f"not a str.format template ({exc}); write {{{{ for a brace") from None
        for name in names:
            if name not in PROMPT_FIELDS:
                allowed = ", ".join("{" + f + "}" for f in PROMPT_FIELDS)
                raise ValueError(f"template field {{{name}}} is not allowed; allowed: {allowed}")
        return value


class InteractionConfig(BaseModel):
    """Budgets of one episode.

    Attributes:
        max_turns: model calls before the episode ends (``max_turns``).
        action_timeout: seconds one shell command may run (the bash tools' ``timeout_s``
            unless a tool entry sets its own).
        timeout_budget: tool calls that may time out before the episode ends.
        max_total_tokens: prompt + completion tokens of the last model call allowed.
        max_observation_chars: cap on one tool observation (head and tail kept).
    """

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=50, ge=1)
    action_timeout: float = Field(default=180.0, gt=0)
    timeout_budget: int = Field(default=3, ge=1)
    max_total_tokens: int = Field(default=65536, ge=1)
    max_observation_chars: int = Field(default=20000, ge=200)


class RewardConfig(BaseModel):
    """How the model patch is graded: ``fresh`` evaluates it in a new sandbox (the default:
    nothing the agent left behind can touch the tests); ``same`` in the agent's sandbox after
    resetting the test files (faster; the agent's processes and files remain)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["fresh", "same"] = "fresh"
    eval_timeout: float | None = Field(default=None, gt=0)


class ClientConfig(BaseModel):
    """The ``client`` block: how the OpenAI-compatible model client rides out a slow or
    restarting server (:class:`~sandlot.rollout.llm.OpenAIChatPolicy`; ``sandlot rollout``'s
    ``--request-timeout`` and ``--retry-budget`` override it).

    Attributes:
        request_timeout_s: seconds one HTTP request may take, connect to last byte.
        retry_budget_s: seconds from a turn's first attempt during which failed attempts are
            retried (the episode waits with its sandbox and conversation); ``0``: no retry.
        backoff_s: the first wait's upper bound; it doubles per retry (full jitter).
        max_backoff_s: the longest wait, unless the server's ``Retry-After`` asks for more.
    """

    model_config = ConfigDict(extra="forbid")

    request_timeout_s: float = Field(default=600.0, gt=0)
    retry_budget_s: float = Field(default=300.0, ge=0)
    backoff_s: float = Field(default=1.0, ge=0)
    max_backoff_s: float = Field(default=30.0, ge=0)


class AgentConfig(BaseModel):
    """The whole ``agent_config.yaml`` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    tools: list[str | dict[str, Any]] = Field(default_factory=lambda: _default_tools())
    tool_parser: str = "hermes"
    reasoning_opened: bool = False
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    interaction: InteractionConfig = Field(default_factory=InteractionConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    concurrency: int = Field(default=8, ge=1)
    client: ClientConfig = Field(default_factory=ClientConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)

    @field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, value: str) -> str:
        if value not in PARSERS:
            raise ValueError(f"unknown tool_parser {value!r}; allowed: {', '.join(PARSERS)}")
        return value

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, value: list[str | dict[str, Any]]) -> list[str | dict[str, Any]]:
        for entry in value:
            name = entry if isinstance(entry, str) else entry.get("name")
            if name not in TOOLS:
                raise ValueError(f"unknown tool {name!r}; allowed: {', '.join(TOOLS)}")
        return value

    def tool_specs(self) -> list[str | dict[str, Any]]:
        """``tools`` with ``action_timeout`` filled into the bash tools that set no timeout."""
        specs: list[str | dict[str, Any]] = []
        for entry in self.tools:
            fields: dict[str, Any] = {"name": entry} if isinstance(entry, str) else dict(entry)
            if fields["name"] in ("bash", "execute_bash"):
                fields.setdefault("timeout_s", self.interaction.action_timeout)
            specs.append(fields)
        return specs


Block = TypeVar("Block", bound=BaseModel)


def with_flags(block: Block, name: str, **flags: Any) -> Block:
    """``block`` (the config's ``name`` block) with the command line's values laid over it;
    a flag left ``None`` was not given.

    Raises:
        ConfigError: a flag names no key of the block, or a value is invalid (names
            ``name.key``).
    """
    unknown = sorted(set(flags) - set(type(block).model_fields))
    if unknown:
        raise ConfigError(f"{name}: unknown key(s) {', '.join(unknown)}")
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        return type(block).model_validate({**block.model_dump(), **given})
    except ValidationError as exc:
        raise ConfigError(_describe(exc, type(block), prefix=name)) from None


def _default_tools() -> list[str | dict[str, Any]]:
    return [*DEFAULT_TOOLS]


def _describe(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """``exc``'s errors as ``key.path: message`` joined by ``; ``; an unknown key (``model``
    validated the data) lists the keys allowed at its level and the closest one."""
    lines = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(p) for p in (prefix, *error["loc"]) if p != "")
        message = error["msg"]
        if error["type"] == "value_error":  # our own message, without pydantic's prefix
            message = str(error.get("ctx", {}).get("error", message))
        elif error["type"] == "extra_forbidden":
            allowed = _keys_at(model, error["loc"][:-1])
            message = unknown_key_message(str(error["loc"][-1]), allowed)
        lines.append(f"{path or '<top>'}: {message}")
    return "; ".join(lines)


def unknown_key_message(key: str, allowed: list[str] | None) -> str:
    """``unknown key`` with the closest allowed key (``difflib``) and the allowed ones, sorted.

    Args:
        key: the key that is not allowed.
        allowed: the keys allowed at its level; ``None`` when unknown.
    """
    if not allowed:
        return "unknown key"
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key{hint}; allowed: {', '.join(sorted(allowed))}"


def _keys_at(model: type[BaseModel], path: tuple[int | str, ...]) -> list[str] | None:
    """The keys of the model reached from ``model`` along ``path`` (nested model fields);
    ``None`` when the path leads to something else (a list, a free-form mapping)."""
    for part in path:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        nested = [
            a
            for a in (field.annotation, *get_args(field.annotation))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not nested:
            return None
        model = nested[0]
    return [field.alias or name for name, field in model.model_fields.items()]


def parse_agent_config(data: Any, *, source: str = "agent config") -> AgentConfig:
    """Validate an already-loaded config (a mapping; ``None`` means all defaults).

    Raises:
        ConfigError: a key is unknown or a value invalid; names the key path (``interaction.
            max_turns``) and, for names, the allowed values.
    """
    try:
        config = AgentConfig.model_validate(data or {})
        # Every block, not only the active backend's: $DEPLOYMENT may pick another one.
        for backend in config.sandbox.options:
            if backend not in available_backends():
                known = ", ".join(available_backends())
                raise ConfigError(f"sandbox.options.{backend}: unknown backend; allowed: {known}")
            config.sandbox.options_for(backend)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc, AgentConfig)}") from None
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


def load_agent_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read and validate ``agent_config.yaml``.

    Raises:
        FileNotFoundError: no such file.
        ConfigError: not YAML, not a mapping, or invalid (the message names file and key path).
    """
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML ({exc})") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{file}: must be a mapping of blocks, got {type(data).__name__}")
    return parse_agent_config(data, source=str(file))
