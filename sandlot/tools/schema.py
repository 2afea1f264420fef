"""OpenAI function schemas generated from pydantic argument models.

``function_schema`` gives the ``{"type": "function", "function": {...}}`` entry of the Chat
Completions ``tools`` list (the format Hermes/Qwen chat templates render too). The JSON schema
pydantic produces is normalised the way models are used to seeing it: ``$ref``/``$defs``
inlined, ``title`` keys dropped, ``Optional[X]`` shown as plain ``X`` (not required), and
``default: null`` dropped.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return _inline({**target, **extra}, defs)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "$defs"):
                continue
            if key == "default" and value is None:
                continue
            out[key] = _inline(value, defs)
        options = out.get("anyOf")
        if isinstance(options, list):
            non_null = [o for o in options if o != {"type": "null"}]
            if len(non_null) == 1 and len(non_null) < len(options):
                del out["anyOf"]
                out = {**non_null[0], **out}
        return out
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def parameters_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The normalised JSON schema of ``model`` (an object schema; a fresh copy each call)."""
    return copy.deepcopy(_parameters_schema(model))


@functools.cache
def _parameters_schema(model: type[BaseModel]) -> dict[str, Any]:
    # Generating a schema costs far more than copying one, and every episode asks again.
    raw = model.model_json_schema()
    schema: dict[str, Any] = _inline(raw, raw.get("$defs", {}))
    schema.setdefault("properties", {})
    schema.pop("description", None)  # the tool's description says it
    return schema


def function_schema(name: str, description: str, model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAI ``tools`` entry of a function ``name`` whose arguments are ``model``."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": parameters_schema(model),
        },
    }
