"""The environment fields of a converted instance, per backend.

Every source converter ends with one of these: the instance's ``image``, ``repo_source``,
``post_setup_cmd``, ``workdir`` (always ``/testbed``, where all three image families and the
local backend keep the repository) and ``env``. A source row's own values for these fields are
replaced; a source ``env`` object (sandlot's instance files have one) is kept and extended.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandlot.datasets.images import LOCAL_IMAGE
from sandlot.datasets.local import mirror_source
from sandlot.datasets.prepare import ConvertContext, SourceError

WORKDIR = "/testbed"


def image_environment(
    record: Mapping[str, Any], image: str, path: str, post_setup_cmd: str | None
) -> dict[str, Any]:
    """Fields of a row that runs in ``image``, with ``PATH`` set to the image's test ``path``."""
    return {
        "image": image,
        "repo_source": None,
        "post_setup_cmd": post_setup_cmd,
        "workdir": WORKDIR,
        "env": {**_source_env(record), "PATH": path},
    }


def local_environment(
    record: Mapping[str, Any], ctx: ConvertContext, post_setup_cmd: str | None
) -> dict[str, Any]:
    """Fields of a ``local`` row: the host image and the repository's mirror as ``repo_source``.

    Raises:
        SourceError: the mirror of the record's ``repo`` does not exist (the message says how to
            create it).
    """
    if ctx.repo_mirror is None:
        raise ValueError("local rows need ctx.repo_mirror")
    repo = str(record.get("repo") or "")
    source = mirror_source(ctx.repo_mirror, repo)
    if not Path(source).is_dir():
        raise SourceError(
            "repo",
            f"no mirror of {repo!r} at {source}; create it with: git clone --mirror "
            f"https://github.com/{repo} {source}",
        )
    return {
        "image": LOCAL_IMAGE,
        "repo_source": source,
        "post_setup_cmd": post_setup_cmd,
        "workdir": WORKDIR,
        "env": _source_env(record),
    }


def _source_env(record: Mapping[str, Any]) -> dict[str, str]:
    env = record.get("env")
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, Mapping) else {}
