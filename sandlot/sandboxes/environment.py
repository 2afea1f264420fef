"""``EnvironmentRecipe``: what a sandbox's test environment needs, in SWE-bench's vocabulary.

The fields are those of a ``swebench`` 4.1 specification (``MAP_REPO_VERSION_TO_SPECS[repo]
[version]``): ``python``, ``pip_packages``, the lines of a requirements file, ``pre_install`` and
``install``. SWE-bench splits them the same way sandlot does
(``swebench.harness.test_spec.python``): the *packages* (``python``, ``pip_packages``,
``requirements``) make the environment (``make_env_script_list_py``) and do not depend on the
repository; the *repository steps* (``pre_install``, then ``install``, e.g.
``python -m pip install -e .``) run in the checked-out repository (``make_repo_script_list_py``).

How a backend provides it. The packages become an isolated virtual environment on every backend
(the recipe's packages and the seed tools of what made it: pip, plus setuptools on Python <
3.12 from ``python -m venv``, or setuptools and wheel from ``uv venv --seed``), first on
``PATH``; the interpreter's own packages (the image's, or on ``local`` with ``image="host"`` the
host interpreter's) are visible only when the recipe sets ``system_site_packages``. The install
has the network it needs; the sandbox the agent gets has ``spec.network`` (docs/backends.md,
"Environment recipes"):

* ``local`` with ``image="host"`` (``Sandbox.on_host``): built once per recipe and interpreter
  on this machine, outside the jail, cached, and mounted read-only
  (:mod:`sandlot.sandboxes.local.venv`); the repository steps install into a per-sandbox
  writable layer on top of it.
* ``local`` with a container image, ``docker``, ``modal``, ``vefaas``: the image's Python
  builds it at :data:`CONTAINER_ENV_DIR` with :meth:`EnvironmentRecipe.container_script`:
  ``local`` in a jail with the network that is then restarted without it, ``docker`` in the
  container before it is disconnected from the engine's network, ``modal`` as an image build
  step (the sandbox itself is created with ``block_network``), ``vefaas`` in the sandbox
  (veFaaS does not enforce a sandbox's network: the function's configuration decides).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

CONTAINER_ENV_DIR = "/opt/sandlot-env"
"""Where :meth:`EnvironmentRecipe.container_script` puts the environment in a container."""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` assumed for a container image whose environment does not set one."""

_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")
_BARE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Exits 0 when every distribution named in argv is installed for this interpreter.
_HAS_ALL = "import importlib.metadata as m, sys; [m.distribution(n) for n in sys.argv[1:]]"


class ProjectSource(BaseModel):
    """A repository snapshot whose declared dependencies go into an environment.

    ``local`` installs the repository itself inside the jail, without network; what its
    ``install`` command would download there (its build backends and its dependencies, extras
    included) is installed into the environment beforehand, on the host
    (:mod:`sandlot.sandboxes.local.venv`).

    Attributes:
        source: a git repository on this machine (a bare mirror or a clone).
        commit: the commit whose ``pyproject.toml``/``setup.py``/``setup.cfg`` declare them
            (the instance's ``base_commit``).
        target: what the install command installs, relative to the repository: ``"."`` or
            ``".[test]"``.
        edits: shell commands run in the checkout first, as the recipe's ``pre_install`` will
            run in the repository before ``install`` (swebench's ``sed -i ... setup.py`` pins),
            so that the dependencies are those the edited files declare. They run on the
            host, in a temporary checkout, like the project's own ``setup.py`` does there.
    """

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1)
    commit: str = Field(min_length=1)
    target: str = "."
    edits: list[str] = Field(default_factory=list)


class EnvironmentRecipe(BaseModel):
    """The test environment of an instance or sandbox (SWE-bench spec fields).

    Installed in SWE-bench's order (``make_env_script_list_py``): the interpreter, then the
    ``requirements`` in one installer call, then ``pip_packages`` in another (so a later pin
    may replace an earlier one, as swebench's pip calls do), then, on ``local``, what
    ``project`` declares.

    Attributes:
        python: interpreter version, ``"3.11"``; ``None`` uses the interpreter sandlot runs on
            (``local``) or the image's ``python3`` (containers). ``local`` cannot download an
            interpreter: the version must exist on the machine (``python3.X`` on ``PATH`` or one
            ``uv python find`` knows).
        pip_packages: pip requirement specifiers, ``["pytest==8.3.3", "numpy<2"]``.
        requirements: lines of a requirements file (a multi-line string is split into lines),
            installed before ``pip_packages``.
        project: the repository snapshot whose build backends and dependencies ``local``
            puts into the environment before ``install`` runs offline (``None``: none).
        pre_install: shell commands run in the repository before ``install``.
        install: shell command that installs the repository, ``"python -m pip install -e ."``.
        system_site_packages: ``True`` lets the environment also see the packages of the
            image's own ``python3`` (a container image, on any backend): an image that already
            has every package is then used as it is. On ``local`` with ``image="host"`` it has
            no effect: the host interpreter's packages belong to no image, and the caller's
            Python is never what a sandbox's tests run on. ``False`` (the default): the
            environment holds only the recipe's packages, the same on every backend.
    """

    model_config = ConfigDict(extra="forbid")

    python: str | None = None
    pip_packages: list[str] = Field(default_factory=list)
    requirements: list[str] = Field(default_factory=list)
    project: ProjectSource | None = None
    pre_install: list[str] = Field(default_factory=list)
    install: str | None = None
    system_site_packages: bool = False

    @field_validator("python", mode="before")
    @classmethod
    def _python_version(cls, value: Any) -> Any:
        if isinstance(value, int | float):
            value = str(value)
        if isinstance(value, str) and not _VERSION.match(value.strip()):
            raise ValueError(f"python must be a version like '3.11', got {value!r}")
        return value.strip() if isinstance(value, str) else value

    @field_validator("requirements", mode="before")
    @classmethod
    def _requirement_lines(cls, value: Any) -> Any:
        lines = value.splitlines() if isinstance(value, str) else value
        if isinstance(lines, list):
            return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        return lines

    @field_validator("pip_packages", "pre_install", mode="before")
    @classmethod
    def _no_blank_items(cls, value: Any) -> Any:
        return [v for v in value if str(v).strip()] if isinstance(value, list) else value

    @property
    def has_packages(self) -> bool:
        """``True`` when the recipe asks for an interpreter or packages (an environment build)."""
        return bool(self.python or self.pip_packages or self.requirements or self.project)

    @property
    def repo_steps(self) -> list[str]:
        """``pre_install`` then ``install``: the commands run in the checked-out repository."""
        return [*self.pre_install, *([self.install] if self.install else [])]

    def packages_only(self) -> EnvironmentRecipe:
        """This recipe without its repository steps (what an environment build depends on)."""
        return self.model_copy(update={"pre_install": [], "install": None})

    def describe(self) -> str:
        """A one-line summary for progress displays and errors: ``python 3.11 + pytest, ...``."""
        parts = [*(["-r <requirements>"] if self.requirements else []), *self.pip_packages]
        if self.project:
            parts.append(f"the dependencies of {self.project.target} at {self.project.commit[:12]}")
        head = f"python {self.python}" if self.python else "python"
        tail = " (+ the interpreter's own packages)" if self.system_site_packages else ""
        return head + (f" + {', '.join(parts)}" if parts else "") + tail

    def digest(self, *salt: str) -> str:
        """A 16-hex-digit content hash of the packages (and ``salt``, e.g. the interpreter)."""
        # The project counts by commit and target, not by where its repository lies.
        project = (
            [self.project.commit, self.project.target, *self.project.edits]
            if self.project
            else None
        )
        # The flag joins the key only when set: environments built before it keep their keys.
        flag = ["system-site-packages"] if self.system_site_packages else []
        payload = json.dumps(
            [self.python, self.pip_packages, self.requirements, *flag, *salt]
            + ([project] if project else []),
            separators=(",", ":"),
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def container_script(self) -> str:
        """POSIX shell script building the environment in a container at
        :data:`CONTAINER_ENV_DIR`, in swebench's order (``make_env_script_list_py``): the
        requirements file, then ``pip_packages``, in separate pip calls.

        The virtual environment is isolated from the image's packages unless
        ``system_site_packages``; then, when every package is a bare name the image's Python
        already has, nothing is built (the image is the environment). pip needs the network
        unless that shortcut applies; the backends give it to this script only
        (:mod:`sandlot.sandboxes.environment`).
        """
        env = shlex.quote(CONTAINER_ENV_DIR)
        want = f"python{self.python}" if self.python else "python3"
        lines = [
            "set -e",
            # A requested version is that version or nothing; otherwise any Python 3.
            f"py=$(command -v {shlex.quote(want)} || true)"
            if self.python
            else "py=$(command -v python3 || command -v python || true)",
            f'[ -n "$py" ] || {{ echo "sandlot: no {want} in this image: the environment needs '
            f'one (use an image with Python {self.python or "3"})" >&2; exit 127; }}',
        ]
        names = self.pip_packages
        bare = names and not self.requirements and all(_BARE_NAME.match(n) for n in names)
        if self.system_site_packages and bare:
            quoted = " ".join(shlex.quote(n) for n in names)
            lines.append(f'"$py" -c {shlex.quote(_HAS_ALL)} {quoted} 2>/dev/null && exit 0')
        flag = " --system-site-packages" if self.system_site_packages else ""
        lines.append(
            f'"$py" -m venv{flag} {env} 2>/dev/null || "$py" -m venv{flag} --without-pip {env}'
        )
        pip = f"{env}/bin/python -m pip install -q --disable-pip-version-check"
        if self.requirements or names:
            lines.append(
                f'{env}/bin/python -m pip --version >/dev/null 2>&1 || {{ echo "sandlot: '
                f"$py cannot put pip into a virtual environment (no ensurepip: on Debian or "
                f'Ubuntu install python3-venv in the image)" >&2; exit 1; }}'
            )
        if self.requirements:
            body = "\n".join(self.requirements)
            lines.append(
                f"cat > {env}/requirements.txt <<'SANDLOT_REQUIREMENTS'\n{body}\n"
                "SANDLOT_REQUIREMENTS"
            )
            lines.append(f"{pip} -r {env}/requirements.txt")
        if names:
            lines.append(f"{pip} " + " ".join(shlex.quote(p) for p in names))
        return "\n".join(lines) + "\n"


def container_path(env: dict[str, str]) -> str:
    """``PATH`` of a container sandbox whose recipe was installed by ``container_script``."""
    return f"{CONTAINER_ENV_DIR}/bin:{env.get('PATH') or DEFAULT_PATH}"
