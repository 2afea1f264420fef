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
    merged_spec = (spec or SandboxSpec()).model_copy(update=spec_fields)
    # model_copy skips validation; re-validate so bad values fail here, not inside a backend.
    merged_spec = SandboxSpec.model_validate(merged_spec.model_dump())
    if isinstance(options, BaseModel):
        opts = options.model_copy(update=option_fields)
        opts = cls.Options.model_validate(opts.model_dump())
    else:
        try:
            opts = cls.Options.model_validate({**(options or {}), **option_fields})
        except ValidationError as exc:
            raise ValueError(f"invalid options for backend {cls.name!r}: {exc}") from exc
    return cls(merged_spec, opts)
