"""How an instance's sandbox is set up: its spec, the repository at ``base_commit``, setup commands.

The agent's sandbox (:mod:`sandlot.rollout`), the evaluation's fresh one (:mod:`sandlot.rewards`)
and training's are set up the same way, here, beside :class:`~sandlot.datasets.instance.Instance`.
Order, as in the SWE-bench harness's env → repo → eval layers: the sandbox starts with the
instance's environment packages (``Instance.environment``), the repository is put at
``base_commit``, the recipe's repository steps (``pre_install``, ``install``) run in it, then the
instance's ``post_setup_cmd``.
"""

from __future__ import annotations

import re
import shlex

import anyio

from sandlot.datasets.git_history import HIDE_STEP, hide_future
from sandlot.datasets.instance import Instance
from sandlot.datasets.swebench_specs import spec_environment
from sandlot.errors import SandboxSetupError
from sandlot.sandboxes.base import Sandbox, output_tail
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.registry import get_backend
from sandlot.sandboxes.spec import SandboxSpec

_URL = re.compile(r"^([a-z][a-z0-9+.-]*://|git@)", re.IGNORECASE)
_SETUP_TIMEOUT_S = 1800.0
# Where a host repository is uploaded before it is cloned into ``workdir`` (then deleted).
_UPLOADED_REPO = "/tmp/sandlot_setup/repo-source"


def is_url(source: str) -> bool:
    """``True`` for git URLs (``https://...``, ``ssh://...``, ``git@host:...``)."""
    return bool(_URL.match(source))


def instance_environment(instance: Instance, backend: str) -> EnvironmentRecipe | None:
    """The environment recipe of ``instance`` on ``backend``.

    The instance's own ``environment`` when it has one (``data prepare --backend local`` puts
    the spec's there). Otherwise, on a backend that runs on this machine (``local``) with the
    image ``"host"``, the recipe of swebench's specification for ``repo`` + ``version``
    (:func:`~sandlot.datasets.swebench_specs.spec_environment`), its requirements file read
    from ``repo_source`` when that is a repository on this machine; an image (a container
    image on any backend, a root filesystem on ``local``) is the environment.

    Raises:
        BackendNotFoundError: unknown backend.
        ValueError: the instance's image map has no image for ``backend``.
        SpecError: the spec needs a repository on this machine and ``repo_source`` is not one,
            or it is a conda environment ``local`` cannot build.
        RequirementsError: the spec's requirements file cannot be read from ``repo_source``.
    """
    if instance.environment is not None:
        return instance.environment
    if not get_backend(backend).on_host or instance.image_for(backend) != "host":
        return None
    source = instance.repo_source
    return spec_environment(instance, source=None if not source or is_url(source) else source)


def instance_spec(instance: Instance, backend: str) -> SandboxSpec:
    """The ``SandboxSpec`` that evaluates ``instance`` on ``backend``.

    The sandbox gets the recipe's packages (its repository steps run after the repository is
    in place, in :func:`prepare_repo`). The network is on when the repository is cloned from
    a URL; the packages' install gets the network from the backend, only while it runs
    (:mod:`sandlot.sandboxes.environment`).

    Raises:
        ValueError: the instance's image map has no image for ``backend``.
        BackendNotFoundError: unknown backend.
    """
    recipe = instance_environment(instance, backend)
    return SandboxSpec(
        image=instance.image_for(backend),
        workdir=instance.workdir,
        env=dict(instance.env),
        environment=recipe.packages_only() if recipe else None,
        network=bool(instance.repo_source and is_url(instance.repo_source)),
        labels={"sandlot.instance_id": instance.instance_id},
    )


FETCH_STEP = "fetch repo"
"""How the ``step`` of a :class:`SandboxSetupError` that fetching the repository at
``base_commit`` raised begins."""


def repository_step(step: str) -> bool:
    """Whether a failed set-up ``step`` (``SandboxSetupError.step``) was bringing the
    repository to ``base_commit``: cloning it, checking the commit out, or cutting the history
    after it (a ``base_commit`` missing from the repository fails one of these)."""
    return step.startswith(FETCH_STEP) or step == HIDE_STEP


async def prepare_repo(sb: Sandbox, instance: Instance, backend: str | None = None) -> None:
    """Put the repository at ``base_commit`` into ``workdir``, run the environment recipe's
    repository steps (``pre_install``, ``install``), then ``post_setup_cmd``; then leave only
    ``HEAD``'s history in the repository (:func:`sandlot.datasets.git_history.hide_future`).

    ``backend`` (default: ``sb.name``) selects the recipe as :func:`instance_environment` does.

    A host path in ``repo_source`` is uploaded and cloned inside the sandbox; a URL is cloned
    inside the sandbox; without ``repo_source`` the image must already hold the repository.

    Raises:
        FileNotFoundError: ``repo_source`` is a host path that does not exist.
        SandboxSetupError: cloning or ``post_setup_cmd`` failed (carries the output tail).
    """
    source = instance.repo_source
    if source:
        if is_url(source):
            script = fetch_repo_script(
                source, instance.workdir, instance.base_commit, uploaded=False
            )
        else:
            if not await anyio.Path(source).exists():
                raise FileNotFoundError(
                    f"repo_source {source} of instance {instance.instance_id} does not exist "
                    "on this machine (for examples/swe-mini run examples/swe-mini/make_repos.py)"
                )
            # An upload copies a symlink as a link: send what it points at.
            await sb.upload(str(await anyio.Path(source).resolve()), _UPLOADED_REPO)
            script = fetch_repo_script(
                _UPLOADED_REPO, instance.workdir, instance.base_commit, uploaded=True
            )
        await _run_setup(sb, script, "/", step=f"{FETCH_STEP} from {source}")
    recipe = instance_environment(instance, backend or sb.name)
    for command in recipe.repo_steps if recipe else []:
        await _run_setup(sb, command, instance.workdir, step="environment install")
    if instance.post_setup_cmd:
        await _run_setup(sb, instance.post_setup_cmd, instance.workdir, step="post_setup_cmd")
    await hide_future(sb, instance)


def fetch_repo_script(source: str, workdir: str, base_commit: str, *, uploaded: bool) -> str:
    """Clone ``source`` into ``workdir`` and check out ``base_commit`` (detached, no remote).

    ``uploaded`` means ``source`` is a path inside the sandbox (a host repo that was uploaded)
    which is deleted afterwards.
    """
    q_src, q_dir, q_commit = shlex.quote(source), shlex.quote(workdir), shlex.quote(base_commit)
    cleanup = f" && rm -rf {q_src}" if uploaded else ""
    return (
        "set -e\n"
        "git config --global --add safe.directory '*'\n"
        f"git clone -q --no-checkout {q_src} {q_dir}\n"
        f"cd {q_dir}\n"
        f"git -c advice.detachedHead=false checkout -q {q_commit}\n"
        f"git remote remove origin{cleanup}\n"
    )


async def _run_setup(sb: Sandbox, script: str, cwd: str, *, step: str) -> None:
    r = await sb.exec(script, timeout=_SETUP_TIMEOUT_S, cwd=cwd)
    if not r.ok:
        raise SandboxSetupError(script, r.exit_code, output_tail(r.stdout + r.stderr), step=step)
