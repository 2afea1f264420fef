"""Environment recipes: the model, per-backend images, the container script, swebench fallbacks,
and the missing-runner check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from pydantic import ValidationError
from requirements import EVAL, need_module

import sandlot
from sandlot.cli.env_cmd import distinct_recipes
from sandlot.datasets.instance import Instance
from sandlot.datasets.sandbox_setup import instance_environment, instance_spec
from sandlot.result import ExecResult
from sandlot.rewards.missing_runner import missing_runner
from sandlot.sandboxes.base import NoOptions, Sandbox
from sandlot.sandboxes.environment import CONTAINER_ENV_DIR, EnvironmentRecipe
from sandlot.sandboxes.registry import register_backend


def _instance(**fields: object) -> Instance:
    base: dict[str, object] = {
        "instance_id": "o__r-1",
        "base_commit": "abc",
        "test_patch": "",
        "FAIL_TO_PASS": ["t"],
    }
    return Instance.model_validate({**base, **fields})


def test_recipe_normalises_swebench_style_fields() -> None:
    recipe = EnvironmentRecipe.model_validate(
        {
            "python": 3.9,
            "pip_packages": ["pytest", " "],
            "requirements": "numpy<2\n# a comment\n\nscipy\n",
            "pre_install": ["sed -i s/a/b/ setup.cfg"],
            "install": "python -m pip install -e .",
        }
    )
    assert recipe.python == "3.9"
    assert recipe.pip_packages == ["pytest"]
    assert recipe.requirements == ["numpy<2", "scipy"]
    assert recipe.repo_steps == ["sed -i s/a/b/ setup.cfg", "python -m pip install -e ."]
    assert recipe.packages_only().repo_steps == []
    assert recipe.packages_only().digest() == recipe.digest()


@pytest.mark.parametrize(
    "bad",
    [{"python": "three"}, {"pip_pakages": ["pytest"]}, {"pip_packages": "pytest"}],
)
def test_recipe_rejects_bad_input_naming_the_field(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        EnvironmentRecipe.model_validate(bad)
    assert next(iter(bad)) in str(info.value)


def test_digest_changes_with_packages_and_interpreter_but_not_repo_steps() -> None:
    a = EnvironmentRecipe(pip_packages=["pytest"])
    assert a.digest("/usr/bin/python3.11") != a.digest("/usr/bin/python3.12")
    assert a.digest() != EnvironmentRecipe(pip_packages=["pytest==8.0"]).digest()
    assert a.digest() == EnvironmentRecipe(pip_packages=["pytest"], install="make").digest()


def test_container_script_uses_the_image_only_when_the_recipe_says_so(tmp_path: Path) -> None:
    target = tmp_path / "env"
    shared = EnvironmentRecipe(pip_packages=["pytest", "pluggy"], system_site_packages=True)
    done = subprocess.run(
        ["bash", "-c", shared.container_script().replace(CONTAINER_ENV_DIR, str(target))]
    )
    assert done.returncode == 0 and not target.exists()  # nothing to build
    missing = shared.model_copy(update={"pip_packages": ["sandlot-not-installed-pkg"]})
    assert "venv --system-site-packages" in missing.container_script().split("&& exit 0")[1]
    isolated = EnvironmentRecipe(pip_packages=["pytest", "pluggy"]).container_script()
    assert "exit 0" not in isolated and "--system-site-packages" not in isolated
    assert f'"$py" -m venv {CONTAINER_ENV_DIR} ' in isolated


def test_container_script_installs_requirements_then_pip_packages_separately() -> None:
    recipe = EnvironmentRecipe(
        pip_packages=["markupsafe==2.1.1"], requirements=["markupsafe==2.1.2"]
    )
    pips = [ln for ln in recipe.container_script().splitlines() if " -m pip install " in ln]
    assert len(pips) == 2  # swebench's order: one call each, so a pin may override the file
    assert pips[0].endswith(f"-r {CONTAINER_ENV_DIR}/requirements.txt")
    assert pips[1].endswith("markupsafe==2.1.1")


def test_digest_keeps_old_keys_and_tells_a_shared_environment_apart() -> None:
    recipe = EnvironmentRecipe(pip_packages=["pytest"])
    shared = recipe.model_copy(update={"system_site_packages": True})
    assert recipe.digest() == "4e73c28b887ac1f6"  # as before the field existed
    assert shared.digest() != recipe.digest()
    assert "own packages" in shared.describe()


@pytest.mark.slow
def test_container_script_with_shared_packages_builds_a_venv_that_sees_them(tmp_path: Path) -> None:
    recipe = EnvironmentRecipe(
        pip_packages=["pytest>=1"], requirements=["pluggy"], system_site_packages=True
    )
    script = recipe.container_script()
    assert f"venv --system-site-packages {CONTAINER_ENV_DIR}" in script
    assert "'pytest>=1'" in script  # quoted for the shell
    assert f"-r {CONTAINER_ENV_DIR}/requirements.txt" in script
    # Run the script with the environment directory moved under tmp_path: this machine's
    # python has pytest and pluggy, so the install is satisfied offline.
    target = tmp_path / "env"
    local_script = script.replace(CONTAINER_ENV_DIR, str(target))
    done = subprocess.run(["bash", "-c", local_script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    check = [str(target / "bin" / "python"), "-c", "import pytest, pluggy"]
    assert subprocess.run(check).returncode == 0


def test_container_script_names_a_missing_interpreter() -> None:
    script = EnvironmentRecipe(python="2.1").container_script()
    env = {"PATH": "/nonexistent"}
    done = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 127
    assert "no python2.1 in this image" in done.stderr


def test_image_map_picks_the_backend_then_default() -> None:
    inst = _instance(image={"local": "host", "default": "python:3.12"})
    assert inst.image_for("local") == "host"
    assert inst.image_for("docker") == "python:3.12"
    only_local = _instance(image={"local": "host"})
    with pytest.raises(ValueError, match=r"not for backend 'modal'.*--image"):
        only_local.image_for("modal")
    with pytest.raises(ValidationError):
        _instance(image={})


class _RecordingContainer(Sandbox):
    """A container-like backend (``on_host`` False) that records the commands it is given."""

    name = "recording-container"
    Options = NoOptions

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.commands: list[str] = []

    async def _start(self) -> None:
        return None

    async def _close(self) -> None:
        return None

    async def exec(self, cmd, *, timeout=None, cwd=None, env=None, stdin=None):  # type: ignore[no-untyped-def]
        self.commands.append(str(cmd))
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.0)

    async def is_alive(self) -> bool:
        return True

    async def read_file(self, path: str) -> bytes:
        raise NotImplementedError

    async def write_file(self, path: str, data: bytes | str) -> None:
        raise NotImplementedError

    async def upload(self, local_path: object, remote_path: str) -> None:
        raise NotImplementedError

    async def download(self, remote_path: str, local_path: object) -> None:
        raise NotImplementedError


@pytest.fixture
def container_backend() -> str:
    register_backend(_RecordingContainer.name, _RecordingContainer)
    return _RecordingContainer.name


def test_container_backend_runs_the_recipe_before_post_setup(container_backend: str) -> None:
    recipe = EnvironmentRecipe(pip_packages=["pytest"], install="pip install -e .")

    async def main() -> list[str]:
        sb = sandlot.open(
            container_backend,
            image="python:3.12",
            environment=recipe,
            post_setup_cmd="echo post",
            env={"PATH": "/custom/bin"},
        )
        assert isinstance(sb, _RecordingContainer)
        assert sb.spec.env["PATH"] == f"{CONTAINER_ENV_DIR}/bin:/custom/bin"
        async with sb:
            return sb.commands

    commands = anyio.run(main)
    assert len(commands) == 3
    assert f"-m venv {CONTAINER_ENV_DIR}" in commands[0]  # isolated from the image's packages
    assert commands[1:] == ["pip install -e .", "echo post"]


def test_container_backend_refuses_the_host_image_with_the_fix(container_backend: str) -> None:
    async def main() -> None:
        async with sandlot.open(container_backend):
            pass

    with pytest.raises(sandlot.SandboxStartError, match=r"only the local backend.*--image") as info:
        anyio.run(main)
    assert info.value.retryable is False


def test_instance_spec_per_backend(container_backend: str) -> None:
    inst = _instance(
        image={"local": "host", "default": "python:3.12"},
        environment={"pip_packages": ["pytest"], "install": "pip install -e ."},
    )
    local = instance_spec(inst, "local")
    assert local.image == "host" and local.network is False
    assert local.environment == EnvironmentRecipe(pip_packages=["pytest"])
    remote = instance_spec(inst, container_backend)
    assert remote.image == "python:3.12"
    assert remote.network is False  # only the backend's install step has the network


def test_swebench_specs_give_local_rows_without_a_recipe_an_environment(
    container_backend: str,
) -> None:
    need_module("swebench", EVAL)
    inst = _instance(repo="astropy/astropy", version="5.0")
    recipe = instance_environment(inst, "local")
    assert recipe is not None
    assert recipe.python == "3.9"
    assert "pytest" in " ".join(recipe.pip_packages)
    assert recipe.install and "pip install -e" in recipe.install
    # Rows prepared for local carry their install commands in post_setup_cmd already.
    with_setup = inst.model_copy(update={"post_setup_cmd": "pip install -e ."})
    assert instance_environment(with_setup, "local").install is None  # type: ignore[union-attr]
    # Container backends take the environment from the image.
    assert instance_environment(inst, container_backend) is None
    assert instance_environment(_instance(repo="unknown/repo", version="1"), "local") is None
    # So does an image on local: the image's own environment, as on docker.
    for image in ("swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest", "/srv/rootfs"):
        on_image = inst.model_copy(update={"image": {"local": image}})
        assert instance_environment(on_image, "local") is None


@pytest.mark.parametrize(
    ("log", "exit_code", "named"),
    [
        (f"{sys.executable}: No module named pytest\n", 1, "No module named pytest"),
        ("bash: line 1: pytest: command not found\n", 127, "pytest: command not found"),
        ("bash: ./run_tests.sh: Permission denied\n", 126, "run_tests.sh: Permission denied"),
    ],
)
def test_missing_runner_is_named(log: str, exit_code: int, named: str) -> None:
    reason = missing_runner(log, exit_code)
    assert reason is not None and named in reason


@pytest.mark.parametrize(
    ("log", "exit_code"),
    [
        ("E   ModuleNotFoundError: No module named 'minicalc'\nFAILED t::x\n", 1),
        (f"{sys.executable}: No module named pytest\n", 0),
        ("tests/test_a.py::test_x FAILED\n", 1),
        ("some output\n", 127),  # exit 127 from the tests themselves, no shell message
        ("", None),
    ],
)
def test_tests_that_ran_are_not_a_missing_runner(log: str, exit_code: int | None) -> None:
    assert missing_runner(log, exit_code) is None


def test_recipes_to_build_skip_image_rows_and_rows_without_an_image_for_the_backend() -> None:
    need_module("swebench", EVAL)
    astropy = {"repo": "astropy/astropy", "version": "5.0"}  # swebench has a spec for it
    rows = [
        _instance(instance_id="o__r-1", environment={"pip_packages": ["pytest"]}),
        _instance(instance_id="o__r-2", image={"docker": "python:3.12"}, **astropy),
        _instance(instance_id="o__r-3", image={"local": "python:3.12"}, **astropy),
    ]
    assert distinct_recipes(rows, "local") == [EnvironmentRecipe(pip_packages=["pytest"])]
