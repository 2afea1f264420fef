"""Where each backend runs an environment recipe's install, and that only the install gets the
network: fast checks at the SDK boundary (the engine-backed check is
``tests/sandboxes/test_recipe_one_environment.py``)."""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from fakes.fake_modal import FakeModal
from fakes.shared import FakeModalSandbox, vefaas_fake_unavailable
from pydantic import ValidationError
from requirements import bwrap_missing, needs

from sandlot import SandboxSpec, SandboxStartError
from sandlot.sandboxes.environment import CONTAINER_ENV_DIR, EnvironmentRecipe
from sandlot.sandboxes.local.venv import ensure_environment
from sandlot.sandboxes.modal import ModalOptions
from sandlot.sandboxes.modal.build_step import build_step

RECIPE = EnvironmentRecipe(python="3.11", pip_packages=["iniconfig==2.0.0"])
# What the fake's build runs instead of creating a real virtualenv (seconds, under load).
QUICK_BUILD = f"mkdir -p {CONTAINER_ENV_DIR}/bin && echo built > {CONTAINER_ENV_DIR}/marker\n"


def test_build_step_is_one_line_running_the_recipe_script_with_the_sandbox_env() -> None:
    step = build_step(RECIPE, {"PIP_INDEX_URL": "http://x/simple", "PATH": "/custom"})
    assert "\n" not in step  # a Dockerfile RUN line
    words = shlex.split(step)
    assert words[:2] == ["printf", "%s"]
    assert base64.b64decode(words[2]).decode() == RECIPE.container_script()
    assert words[-3:] == ["env", "PIP_INDEX_URL=http://x/simple", "sh"]  # the image's PATH


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModal]:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    monkeypatch.setattr(EnvironmentRecipe, "container_script", lambda self: QUICK_BUILD)
    f = FakeModal()
    monkeypatch.setattr(FakeModalSandbox, "fake", f)
    yield f
    f.close()


@needs(bwrap_missing)
def test_modal_builds_the_recipe_into_the_image_and_blocks_the_sandbox(fake: FakeModal) -> None:
    spec = SandboxSpec(image="python:3.12", environment=RECIPE, env={"PIP_NO_CACHE_DIR": "1"})

    async def main() -> str:
        async with FakeModalSandbox(spec, ModalOptions()) as sb:
            r = await sb.exec(f"cat {CONTAINER_ENV_DIR}/marker")
            assert r.ok, r.stderr
            return r.stdout

    assert anyio.run(main) == "built\n"
    ((step,), build) = fake.calls_of("Image.build")[0]
    assert step == build_step(RECIPE, spec.env) and build == {"network": True}
    ((_, create),) = fake.calls_of("Sandbox.create")
    assert create["block_network"] is True and create["image"].commands == (step,)
    # The install is not a command of the sandbox: it ran in the build.
    assert not any("echo built" in " ".join(a) for a, _ in fake.calls_of("Sandbox.exec"))


@needs(bwrap_missing)
def test_modal_reports_a_failed_recipe_build_at_start(
    fake: FakeModal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EnvironmentRecipe, "container_script", lambda self: "exit 3\n")
    spec = SandboxSpec(image="python:3.12", environment=RECIPE)

    async def main() -> None:
        async with FakeModalSandbox(spec, ModalOptions()):
            pass

    with pytest.raises(SandboxStartError, match="Image build failed"):
        anyio.run(main)
    assert not fake.live()


@needs(bwrap_missing)
def test_modal_fork_of_a_snapshot_builds_nothing(fake: FakeModal) -> None:
    spec = SandboxSpec(image="python:3.12", environment=RECIPE)

    async def main() -> None:
        async with FakeModalSandbox(spec, ModalOptions()) as sb:
            snap = await sb.snapshot()
        import sandlot

        async with sandlot.open(snapshot=snap) as fork:
            assert (await fork.exec(f"cat {CONTAINER_ENV_DIR}/marker")).stdout == "built\n"
        await snap.delete()

    anyio.run(main)
    assert len(fake.calls_of("Image.build")) == 1


@pytest.mark.parametrize("shared", [False, True])
def test_a_host_environment_never_sees_the_host_interpreters_packages(
    shared: bool, tmp_path: Path
) -> None:
    recipe = EnvironmentRecipe(system_site_packages=shared)
    built = ensure_environment(recipe, root=tmp_path)
    config = (built.path / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in config


@needs(vefaas_fake_unavailable)
def test_vefaas_installs_the_recipe_in_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    # veFaaS has no per-sandbox network switch (the function's configuration decides): the
    # install is a command of the sandbox, through its SWE-ReX server.
    from fakes.fake_vefaas import FakeVefaas

    from sandlot.sandboxes.vefaas import VefaasOptions, VefaasSandbox

    for var in ("VOLCE_ACCESS_KEY", "VOLCE_SECRET_KEY", "VEFAAS_FUNCTION_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(EnvironmentRecipe, "container_script", lambda self: QUICK_BUILD)
    fake = FakeVefaas().start()
    spec = SandboxSpec(image="python:3.12", environment=RECIPE)

    async def main() -> str:
        async with VefaasSandbox(spec, VefaasOptions(**fake.options())) as sb:
            return (await sb.exec(f"cat {CONTAINER_ENV_DIR}/marker; echo $PATH")).stdout

    try:
        marker, path = anyio.run(main).splitlines()
    finally:
        fake.stop()
    assert marker == "built" and path.startswith(f"{CONTAINER_ENV_DIR}/bin:")
    (body,) = fake.actions("CreateSandbox")
    assert not any("network" in key.lower() for key in body)


def test_a_bad_system_site_packages_value_names_the_field() -> None:
    with pytest.raises(ValidationError, match="system_site_packages"):
        EnvironmentRecipe.model_validate({"system_site_packages": "maybe"})
