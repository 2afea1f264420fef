"""``sandlot.open``: the one call users make to get a sandbox."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.registry import get_backend
from sandlot.sandboxes.spec import SandboxSpec


def open(
    backend: str | None = None,
    spec: SandboxSpec | None = None,
    *,
    options: BaseModel | dict[str, Any] | None = None,
    **fields: Any,
) -> Sandbox:
    """Create a (not yet started) sandbox; use it as ``async with sandlot.open(...) as sb``.

    Args:
        backend: backend name; ``None`` resolves ``$SANDLOT_BACKEND``, then ``$DEPLOYMENT``,
            then ``"local"``.
        spec: a full ``SandboxSpec``; keyword ``fields`` override its values.
        options: backend-specific options (the backend's ``Options`` model or a dict).
        **fields: ``SandboxSpec`` fields (``image``, ``post_setup_cmd``, ...) or, failing that,
            fields of the backend's ``Options`` model (e.g. ``isolation="none"`` for ``local``).

    Raises:
        BackendNotFoundError: unknown backend (the message lists the known ones).
        ValueError: a keyword is neither a spec field nor an option of this backend.
        pydantic.ValidationError: a value has the wrong type.
    """
    cls = get_backend(backend)
    spec_fields = {k: v for k, v in fields.items() if k in SandboxSpec.model_fields}
    option_fields = {k: v for k, v in fields.items() if k not in spec_fields}
    unknown = [k for k in option_fields if k not in cls.Options.model_fields]
    if unknown:
        raise ValueError(
            f"unknown sandbox setting(s) {', '.join(map(repr, unknown))} for backend "
            f"{cls.name!r}. Spec fields: {', '.join(SandboxSpec.model_fields)}. "
            f"{cls.name} options: {', '.join(cls.Options.model_fields) or '(none)'}."
        )
    # Validated as one dict, so bad values fail here, not inside a backend (model_copy would
    # not validate, and would store a dict where a nested model belongs).
    base = (spec or SandboxSpec()).model_dump()
    merged_spec = SandboxSpec.model_validate({**base, **spec_fields})
    if isinstance(options, BaseModel):
        opts = cls.Options.model_validate({**options.model_dump(), **option_fields})
    else:
        try:
            opts = cls.Options.model_validate({**(options or {}), **option_fields})
        except ValidationError as exc:
            raise ValueError(f"invalid options for backend {cls.name!r}: {exc}") from exc
    return cls(merged_spec, opts)
