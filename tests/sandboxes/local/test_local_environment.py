"""The local backend's cached test environments: build once, mount read-only, install on top.

Packages come from wheels made here, so these tests need no package index.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import anyio
import pytest
from local_helpers import needs_bwrap

import sandlot
from sandlot.errors import EnvironmentBuildError
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.local import venv
from sandlot.sandboxes.local.venv import (
    MARKER,
    ensure_environment,
    find_interpreter,
    list_environments,
    prune_environments,
)

pytestmark = [pytest.mark.anyio, needs_bwrap]


def make_wheel(directory: Path, name: str, value: int) -> Path:
    """A minimal pure-Python wheel ``name`` whose module holds ``VALUE = value``."""
    dist = f"{name}-1.0"
    files = {
        f"{name}/__init__.py": f"VALUE = {value}\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: sandlot-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "envs"
    monkeypatch.setenv(venv.CACHE_ENV, str(root))
    return root


@pytest.fixture
def probe_recipe(tmp_path: Path) -> EnvironmentRecipe:
    return EnvironmentRecipe(pip_packages=[str(make_wheel(tmp_path, "sandlot_probe", 42))])


async def test_environment_is_first_on_path_read_only_and_caller_free(
    cache: Path, probe_recipe: EnvironmentRecipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller's virtualenv on PATH must not reach the jail.
    monkeypatch.setenv("VIRTUAL_ENV", "/opt/caller-venv")
    monkeypatch.setenv("PATH", f"/opt/caller-venv/bin:{os.environ['PATH']}")
    async with sandlot.open("local", environment=probe_recipe) as sb:
        r = await sb.exec("python -c 'import sandlot_probe, sys; print(sandlot_probe.VALUE)'")
        assert (r.exit_code, r.stdout.strip()) == (0, "42"), r.stderr
        [env] = list_environments(cache)
        assert (await sb.exec("command -v python3")).stdout.strip() == str(env.path / "bin/python3")
        path = (await sb.exec("echo $PATH")).stdout
        assert "/opt/caller-venv" not in path
        assert "VIRTUAL_ENV=/opt/caller-venv" not in (await sb.exec("env")).stdout
        write = await sb.exec(f"touch {env.path}/bin/planted")
        assert write.exit_code != 0 and "Read-only" in write.stderr
    assert not (env.path / "bin" / "planted").exists()


async def pip_install(sb: sandlot.Sandbox, wheel: Path) -> None:
    """Upload ``wheel`` into ``sb`` and install it with the sandbox's pip."""
    await sb.upload(wheel, f"/tmp/{wheel.name}")
    pip = await sb.exec(f"python -m pip install --no-index -q /tmp/{wheel.name}")
    assert pip.exit_code == 0, pip.stdout + pip.stderr


async def test_pip_install_in_a_sandbox_lands_in_its_own_overlay(
    cache: Path, probe_recipe: EnvironmentRecipe, tmp_path: Path
) -> None:
    extra = make_wheel(tmp_path, "sandlot_extra", 7)
    async with sandlot.open("local", environment=probe_recipe) as sb:
        await pip_install(sb, extra)
        imports = "import sandlot_extra, sandlot_probe; print(sandlot_extra.VALUE)"
        r = await sb.exec(["python", "-c", imports])
        assert r.stdout.strip() == "7", r.stderr
    async with sandlot.open("local", environment=probe_recipe) as other:
        r = await other.exec("python -c 'import sandlot_extra'")
        assert r.exit_code != 0 and "No module named" in r.stderr
    [env] = list_environments(cache)
    assert not list(env.path.rglob("sandlot_extra*"))


async def test_repo_steps_run_in_workdir_after_the_packages(
    cache: Path, probe_recipe: EnvironmentRecipe
) -> None:
    recipe = probe_recipe.model_copy(
        update={"pre_install": ["pwd > pre.txt"], "install": "python -c 'import sandlot_probe' "}
    )
    async with sandlot.open("local", environment=recipe, post_setup_cmd="cat pre.txt") as sb:
        assert (await sb.read_file("/testbed/pre.txt")).decode().strip() == "/testbed"


def test_concurrent_builds_of_one_recipe_build_once(
    cache: Path, probe_recipe: EnvironmentRecipe
) -> None:
    messages: list[str] = []
    results = []

    def worker() -> None:
        results.append(ensure_environment(probe_recipe, progress=messages.append))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.path for r in results}) == 1 and len(results) == 8
    assert sum(m.startswith("building environment") for m in messages) == 1


def test_two_processes_build_once(cache: Path, probe_recipe: EnvironmentRecipe) -> None:
    code = (
        "import sys; from sandlot.sandboxes.environment import EnvironmentRecipe\n"
        "from sandlot.sandboxes.local.venv import ensure_environment\n"
        "r = EnvironmentRecipe.model_validate_json(sys.argv[1])\n"
        "ensure_environment(r, progress=lambda m: print(m, flush=True))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, probe_recipe.model_dump_json()],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sum(out.count("building environment") for out in outputs) == 1


def test_an_unfinished_environment_is_rebuilt_never_used(
    cache: Path, probe_recipe: EnvironmentRecipe
) -> None:
    built = ensure_environment(probe_recipe)
    (built.path / MARKER).unlink()  # what a killed build leaves: no marker
    (built.path / "half-written").write_text("junk")
    messages: list[str] = []
    again = ensure_environment(probe_recipe, progress=messages.append)
    assert again.path == built.path and (again.path / MARKER).is_file()
    assert not (again.path / "half-written").exists()
    assert any(m.startswith("building environment") for m in messages)


def test_an_interrupted_build_leaves_nothing(
    cache: Path, probe_recipe: EnvironmentRecipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = venv._run

    def interrupted(argv: list[str], what: str, *args: object) -> None:
        if what == "installing pip_packages":
            raise KeyboardInterrupt
        real_run(argv, what, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(venv, "_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_environment(probe_recipe)
    assert [e.path.name for e in list_environments(cache)] == []


def test_a_package_that_does_not_exist_is_named_and_not_cached(cache: Path) -> None:
    missing = "/nonexistent/sandlot_missing-1.0-py3-none-any.whl"
    with pytest.raises(EnvironmentBuildError, match="installing pip_packages failed") as info:
        ensure_environment(EnvironmentRecipe(pip_packages=[missing]))
    assert "sandlot_missing" in str(info.value)
    assert list_environments(cache) == []


@pytest.mark.slow
def test_a_package_unknown_to_the_index_is_named(cache: Path) -> None:
    name = "sandlot-no-such-package-4f1c2a"
    with pytest.raises(EnvironmentBuildError, match=name):
        ensure_environment(EnvironmentRecipe(pip_packages=[name]))
    assert list_environments(cache) == []


def test_a_missing_interpreter_version_says_so() -> None:
    with pytest.raises(EnvironmentBuildError, match=r"no python2\.1.*cannot switch interpreters"):
        find_interpreter("2.1")


async def test_a_failed_build_fails_the_start_at_once(cache: Path) -> None:
    recipe = EnvironmentRecipe(pip_packages=["/nonexistent/x-1.0-py3-none-any.whl"])
    started = anyio.current_time()
    with pytest.raises(EnvironmentBuildError) as info:
        async with sandlot.open("local", environment=recipe):
            pass
    assert info.value.retryable is False
    assert anyio.current_time() - started < 30  # no retries with backoff


def test_prune_removes_unused_and_unfinished(cache: Path, probe_recipe: EnvironmentRecipe) -> None:
    built = ensure_environment(probe_recipe)
    (cache / "deadbeefdeadbeef").mkdir()  # unfinished
    assert len(prune_environments(older_than_s=3600, dry_run=True)) == 1
    assert {e.path.name for e in prune_environments(older_than_s=3600)} == {"deadbeefdeadbeef"}
    assert built.path.is_dir()
    assert [e.path for e in prune_environments()] == [built.path]
    assert list_environments(cache) == []


@pytest.mark.e2e
async def test_a_fork_has_the_environment_and_what_its_set_up_installed(
    cache: Path, probe_recipe: EnvironmentRecipe, tmp_path: Path
) -> None:
    extra = make_wheel(tmp_path, "sandlot_extra", 7)
    async with sandlot.open("local", environment=probe_recipe) as sb:
        await pip_install(sb, extra)
        snap = await sb.snapshot()
    try:
        async with sandlot.open(snapshot=snap) as fork:
            imports = "import sandlot_extra as e, sandlot_probe as p; print(e.VALUE, p.VALUE)"
            r = await fork.exec(["python", "-c", imports])
            assert r.stdout.split() == ["7", "42"], r.stderr
    finally:
        await snap.delete()
