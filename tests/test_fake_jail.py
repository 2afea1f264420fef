"""The cloud fakes' jail (``tests/fakes/jail.py``) shows the running interpreter even where the
fake container has a private directory of its own (a virtualenv or a checkout under ``/tmp``),
and an exec that joins a fake sandbox's PID namespace is not killed by bwrap's own start-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fakes import jail
from fakes.jail import jail_argv, make_root, private_host_paths
from requirements import bwrap_missing, needs


def test_prefixes_under_private_dirs_are_bound_outermost_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "clone"
    venv = checkout / ".venv"
    venv.mkdir(parents=True)
    monkeypatch.setattr(jail, "_CHECKOUT", checkout)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert str(tmp_path).startswith("/tmp/")
    assert private_host_paths() == [str(checkout)]  # the venv is inside the checkout
    monkeypatch.setattr(jail, "_CHECKOUT", Path("/usr/share"))
    assert private_host_paths() == [str(venv)]


@needs(bwrap_missing)
def test_a_virtualenv_under_tmp_is_visible_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "marker").write_text("seen\n")
    monkeypatch.setattr(sys, "prefix", str(venv))
    root = make_root(tmp_path, "root")
    argv = jail_argv(root, network=False, own_pids=True, env={"PATH": "/usr/bin:/bin"})
    script = f"cat {venv}/bin/marker; touch {venv}/bin/new 2>/dev/null || echo read-only"
    out = subprocess.run([*argv, "/bin/sh", "-c", script], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "seen\nread-only\n"), out.stderr


def test_a_command_joining_a_pid_namespace_has_no_parent_death_signal(tmp_path: Path) -> None:
    # bwrap --pidns starts the command under an intermediate child that exits at once; with
    # --die-with-parent that exit SIGKILLed execs on a loaded machine (exit 137 within ms).
    root = make_root(tmp_path, "root")
    joined = jail_argv(root, network=True, own_pids=False, env={}, pidns=3)
    first = jail_argv(root, network=True, own_pids=True, env={})
    assert "--pidns" in joined and "--die-with-parent" not in joined
    assert "--die-with-parent" in first
