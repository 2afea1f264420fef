"""``sandlot.open``: the one call users make to get a sandbox."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.registry import get_backend
from sandlot.sandboxes.snapshot import Snapshot
from sandlot.sandboxes.spec import SandboxSpec

# What a fork takes from its snapshot: the set-up its files already hold.
_SET_UP = ("image", "workdir", "environment", "post_setup_cmd")


def open(
    backend: str | None = None,
    spec: SandboxSpec | None = None,
    *,
    options: BaseModel | dict[str, Any] | None = None,
    snapshot: Snapshot[Sandbox] | None = None,
    **fields: Any,
) -> Sandbox:
    """Create a (not yet started) sandbox; use it as ``async with sandlot.open(...) as sb``.

    Args:
        backend: backend name; ``None`` resolves ``$SANDLOT_BACKEND``, then ``$DEPLOYMENT``,
            then ``"local"`` (:func:`~sandlot.sandboxes.registry.choose_backend`; with
            ``snapshot``: the snapshot's backend).
        spec: a full ``SandboxSpec``; keyword ``fields`` override its values (default: the
            snapshot's spec, else the defaults).
        options: backend-specific options (the backend's ``Options`` model or a dict;
            default: the snapshot's).
        snapshot: open a fork of this :class:`~sandlot.sandboxes.snapshot.Snapshot`
            (``await sb.snapshot()``): it starts with the snapshot's files and skips the
            set-up; a fallback snapshot's fork is set up from the spec as usual. ``image``,
            ``workdir``, ``environment`` and ``post_setup_cmd`` are the snapshot's.
        **fields: ``SandboxSpec`` fields (``image``, ``post_setup_cmd``, ...) or, failing that,
            fields of the backend's ``Options`` model (e.g. ``isolation="none"`` for ``local``).

    Raises:
        BackendNotFoundError: unknown backend (the message lists the known ones).
        ValueError: a keyword is neither a spec field nor an option of this backend, or a fork
            is asked for another backend or another set-up than its snapshot's.
        pydantic.ValidationError: a value has the wrong type.
    """
    cls = snapshot.backend if snapshot is not None and backend is None else get_backend(backend)
    if snapshot is not None:
        if cls is not snapshot.backend:
            raise ValueError(
                f"a snapshot of the {snapshot.backend.name} backend cannot start a "
                f"{cls.name} sandbox; leave backend unset to open a fork"
            )
        spec = spec or snapshot.spec
        options = options if options is not None else snapshot.options
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
    # not validate, and would store a dict where a nested model belongs). Only the fields
    # set: a backend tells a default from a choice (an image's WorkingDir fills an unset
    # workdir, as `docker run` without -w).
    base = (spec or SandboxSpec()).model_dump(exclude_unset=True)
    merged_spec = SandboxSpec.model_validate({**base, **spec_fields})
    if isinstance(options, BaseModel):
        opts = cls.Options.model_validate({**options.model_dump(), **option_fields})
    else:
        try:
            opts = cls.Options.model_validate({**(options or {}), **option_fields})
        except ValidationError as exc:
            raise ValueError(f"invalid options for backend {cls.name!r}: {exc}") from exc
    sandbox = cls(merged_spec, opts)
    if snapshot is not None:
        _check_fork(snapshot, sandbox)
        sandbox.origin = snapshot if snapshot.native else None
    return sandbox


def _check_fork(snapshot: Snapshot[Sandbox], sandbox: Sandbox) -> None:
    changed = [
        name for name in _SET_UP if getattr(sandbox.spec, name) != getattr(snapshot.spec, name)
    ]
    if changed:
        raise ValueError(
            f"a fork keeps its snapshot's set-up, but {', '.join(changed)} differ; open a "
            "sandbox from the spec instead (without snapshot=)"
        )
