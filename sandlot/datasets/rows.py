"""``TaskRow``: one training task as verl reads it from parquet (row schema version 1).

verl's ``RLHFDataset`` (``verl/utils/dataset/rl_dataset.py``, verl 0.9.1) loads a parquet file
with Hugging Face ``datasets``, turns ``prompt`` into ``raw_prompt`` and hands every column to the
agent loop as a keyword argument; ``extra_info.index`` becomes ``index`` and
``extra_info.tools_kwargs`` becomes ``tools_kwargs``. One row::

    prompt        list<struct<role: string, content: string>>   system + user message
    data_source   string      the dataset the row came from ("princeton-nlp/SWE-bench_Verified")
    agent_name    string      the agent loop that runs it ("swe_agent")
    reward_model  struct<style: string, ground_truth: string>   {"style": "rule",
                                                                 "ground_truth": instance_id}
    extra_info    struct<
      index: int64                 position in the file
      instance_id: string
      schema_version: int64        ROW_SCHEMA_VERSION
      tools_kwargs: struct<
        env: struct<
          image: string, post_setup_cmd: string (null = none), workdir: string,
          repo_source: string (null = the image holds the repository),
          env_variables: string    JSON object {name: value}
          sandbox: struct<backend: string, network: bool>>
        reward: struct<name: string, metadata: string>   metadata: JSON of the Instance
      >>

Why two fields are JSON text: Arrow stores a dict as a struct whose fields are the union of the
keys of every row, so rows with different environment variables (or instances with different
extra fields) would come back with each other's keys set to ``null``. ``env_variables`` and
``metadata`` are therefore JSON strings; :meth:`TaskRow.from_record` (and so every sandlot
reader) decodes them, and also accepts them already decoded (a dict), as written by other tools.
Everything else has one fixed type (:func:`sandlot.datasets.parquet.row_arrow_schema`).

``metadata`` is the whole :class:`~sandlot.datasets.instance.Instance` the evaluator takes; the
``env`` fields repeat its environment fields for the agent loop and must agree with them.

Rows written by uni-agent's preprocessing scripts are read too: :class:`TaskRow` rewrites
them on validation (:mod:`sandlot.datasets.uni_agent`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from sandlot.datasets.instance import Instance, is_remote_source
from sandlot.datasets.uni_agent import is_uni_agent_row, to_sandlot_record
from sandlot.errors import BackendNotFoundError
from sandlot.sandboxes.registry import check_backend_name

ROW_SCHEMA_VERSION: Final = 1
DEFAULT_AGENT_NAME = "swe_agent"


class Message(BaseModel):
    """One chat message of the prompt."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class RewardModel(BaseModel):
    """verl's ``reward_model`` column: the instance id is the rule reward's ground truth."""

    model_config = ConfigDict(extra="forbid")

    style: Literal["rule"] = "rule"
    ground_truth: str = Field(min_length=1)


class SandboxHints(BaseModel):
    """How to open the row's sandbox beyond the image: backend and outbound network."""

    model_config = ConfigDict(extra="forbid")

    backend: str
    """Any registered backend: built in, an entry point of ``sandlot.backends``, or one
    registered in this process (``register_backend``)."""
    network: bool = False

    @field_validator("backend")
    @classmethod
    def _registered(cls, value: str) -> str:
        name = value.strip().lower()
        try:
            check_backend_name(name)
        except BackendNotFoundError as exc:
            raise ValueError(str(exc)) from None  # pydantic names the field
        return name


class EnvKwargs(BaseModel):
    """``tools_kwargs.env``: what the agent loop needs to bring the sandbox up."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1)
    post_setup_cmd: str | None = None
    workdir: str = Field(min_length=1)
    repo_source: str | None = None
    env_variables: dict[str, str] = Field(default_factory=dict)
    sandbox: SandboxHints

    @field_validator("env_variables", mode="before")
    @classmethod
    def _decode_env(cls, value: Any) -> Any:
        return _json_object(value, "env_variables")

    @field_serializer("env_variables", when_used="json")
    def _encode_env(self, value: dict[str, str]) -> str:
        return json.dumps(value, sort_keys=True)


class RewardKwargs(BaseModel):
    """``tools_kwargs.reward``: the reward's name and the instance it grades."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    metadata: Instance

    @field_validator("metadata", mode="before")
    @classmethod
    def _decode_metadata(cls, value: Any) -> Any:
        return _json_object(value, "metadata")

    @field_serializer("metadata", when_used="json")
    def _encode_metadata(self, value: Instance) -> str:
        return value.model_dump_json()


class ToolsKwargs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env: EnvKwargs
    reward: RewardKwargs


class ExtraInfo(BaseModel):
    """verl's ``extra_info`` column (passed to the agent loop and to ``compute_score``)."""

    model_config = ConfigDict(extra="allow")

    index: int = Field(ge=0)
    instance_id: str = Field(min_length=1)
    schema_version: Literal[1] = ROW_SCHEMA_VERSION
    tools_kwargs: ToolsKwargs


class TaskRow(BaseModel):
    """One parquet row (schema in the module docstring). Extra columns are kept."""

    model_config = ConfigDict(extra="allow")

    prompt: list[Message] = Field(min_length=1)
    data_source: str = Field(min_length=1)
    agent_name: str = Field(min_length=1)
    reward_model: RewardModel
    extra_info: ExtraInfo

    @model_validator(mode="before")
    @classmethod
    def _from_uni_agent(cls, data: Any) -> Any:
        # Rows made by uni-agent's preprocessing scripts are read in their sandlot form.
        if isinstance(data, Mapping) and is_uni_agent_row(data):
            return to_sandlot_record(data)
        return data

    @property
    def instance(self) -> Instance:
        """The instance the evaluator takes (``extra_info.tools_kwargs.reward.metadata``)."""
        return self.extra_info.tools_kwargs.reward.metadata

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TaskRow:
        """Validate a record as read from parquet (JSON fields as text or already decoded).

        A row in one of uni-agent's layouts is rewritten first
        (:func:`sandlot.datasets.uni_agent.to_sandlot_record`).

        Raises:
            pydantic.ValidationError: a field is missing or has the wrong type.
        """
        return cls.model_validate(_plain(record))

    def to_record(self) -> dict[str, Any]:
        """The record written to parquet: plain Python values, JSON fields as text."""
        record: dict[str, Any] = self.model_dump(mode="json")
        return record


def build_row(
    instance: Instance,
    *,
    index: int,
    prompt: list[dict[str, str]],
    data_source: str,
    reward_name: str,
    backend: str,
    agent_name: str = DEFAULT_AGENT_NAME,
) -> TaskRow:
    """The row of ``instance``: its environment fields copied into ``tools_kwargs.env``."""
    env = EnvKwargs(
        image=instance.image_for(backend),
        post_setup_cmd=instance.post_setup_cmd,
        workdir=instance.workdir,
        repo_source=instance.repo_source,
        env_variables=instance.env,
        sandbox=SandboxHints(
            backend=backend,
            network=bool(instance.repo_source and is_remote_source(instance.repo_source)),
        ),
    )
    return TaskRow(
        prompt=[Message.model_validate(m) for m in prompt],
        data_source=data_source,
        agent_name=agent_name,
        reward_model=RewardModel(ground_truth=instance.instance_id),
        extra_info=ExtraInfo(
            index=index,
            instance_id=instance.instance_id,
            tools_kwargs=ToolsKwargs(
                env=env, reward=RewardKwargs(name=reward_name, metadata=instance)
            ),
        ),
    )


def _json_object(value: Any, field: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{field} is a string but not JSON ({exc.msg} at char {exc.pos})"
        ) from None
    if not isinstance(decoded, dict):
        raise ValueError(f"{field} must hold a JSON object, got {type(decoded).__name__}")
    return decoded


def _plain(value: Any) -> Any:
    """numpy arrays and scalars (as ``datasets``/pandas return them) → lists and Python values."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return value
