"""Which model changes count as test infrastructure (``sandlot.rewards.integrity.policy``)."""

from __future__ import annotations

import pytest

from sandlot.datasets.instance import Instance
from sandlot.rewards.integrity.policy import (
    RevertPolicy,
    path_reason,
    runner_sections_changed,
    select,
)


@pytest.mark.parametrize(
    ("path", "added", "why"),
    [
        ("conftest.py", False, "conftest"),
        ("src/pkg/conftest.py", True, "conftest"),
        ("pytest.ini", True, "configuration"),
        ("sub/tox.ini", False, "configuration"),
        ("noxfile.py", True, "configuration"),
        (".pytest_cache/v/cache/lastfailed", True, "cache"),
        ("pkg/__pycache__/mod.cpython-311.pyc", True, "cache"),
        ("pytest.py", False, "shadows"),
        ("pkg/pytest.py", True, "shadows"),
        ("_pytest/__init__.py", True, "shadows"),
        ("sitecustomize.py", True, "shadows"),
        ("lib/usercustomize.py", True, "shadows"),
        ("pkg/evil.pth", False, "shadows"),
        ("argparse.py", True, "standard-library"),
        ("json/__init__.py", True, "standard-library"),
        ("iniconfig.py", True, "test-runner dependency"),
        ("x.egg-info/entry_points.txt", True, "metadata"),
        ("tests/helpers.py", False, "test code"),
        ("pkg/testing/data.json", True, "test code"),
        ("pkg/test_mod.py", True, "test code"),
        ("pkg/mod_test.py", False, "test code"),
    ],
)
def test_infrastructure_paths_are_reverted(path: str, added: bool, why: str) -> None:
    reason = path_reason(path, added=added)
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    ("path", "added"),
    [
        ("minicalc/ops.py", False),
        ("minicalc/new_module.py", True),
        ("README.md", False),
        # pytest's own repository: its _pytest and pytest.py are the code under test
        ("src/_pytest/runner.py", False),
        ("src/pytest/__init__.py", False),
        ("src/pytest.py", False),
        # an existing top-level module named like a stdlib one is the repository's own
        ("typing.py", False),
        ("latest.py", True),
    ],
)
def test_code_under_test_is_kept(path: str, added: bool) -> None:
    assert path_reason(path, added=added) is None


def test_setup_cfg_runner_sections() -> None:
    base = "[metadata]\nname = x\n\n[tool:pytest]\naddopts = -rA\n"
    other_section = base.replace("name = x", "name = y")
    assert runner_sections_changed("setup.cfg", base, other_section) is None
    hooked = base + "testpaths = tests\n"
    reason = runner_sections_changed("setup.cfg", base, hooked)
    assert reason is not None and "tool:pytest" in reason
    assert runner_sections_changed("setup.cfg", None, "[pytest]\naddopts = -p x\n") is not None
    assert runner_sections_changed("setup.cfg", base, "[unclosed\n") is not None


_META = "[metadata]\nname = x\n"
_CFG = _META + "\n[tool:pytest]\ntestpaths = tests\n"


@pytest.mark.parametrize(
    ("base", "after"),
    [
        # configparser's header regex is greedy: section "tool:pytest] # " for it, pytest
        # (iniconfig) cuts the line at the comment.
        pytest.param(
            _META, "[metadata]\nname = x\n[tool:pytest] # ]\naddopts = -p evil\n", id="hash-]"
        ),
        pytest.param(
            _META, "[metadata]\nname = x\n[tool:pytest] ; ]\naddopts = -p evil\n", id="semi-]"
        ),
        # A "[" line without a closing "]" (comment cut) continues testpaths for pytest, and
        # the keys after it land in [tool:pytest]; configparser reads a section [flake8].
        pytest.param(_CFG, _CFG + "[flake8]x\naddopts = -p evil\n", id="bracket-continuation"),
        pytest.param(_CFG, _CFG + "[flake8;]\naddopts = -p evil\n", id="semicolon-in-header"),
        # Line ends other than \n: pytest splits lines with str.splitlines (and opens the file
        # with universal newlines); configparser only at \n, reading one long [metadata] value.
        *(
            pytest.param(_META, f"{_META[:-1]}{sep}[tool:pytest]{sep}addopts = -p evil\n", id=name)
            for name, sep in (
                ("formfeed", "\f"),
                ("cr", "\r"),
                ("vt", "\v"),
                ("fs", "\x1c"),
                ("nel", "\x85"),
                ("u2028", "\u2028"),
            )
        ),
        # What pytest cannot parse (a usage error) counts as changed; configparser merged it.
        pytest.param(_CFG, _CFG + "[metadata]\nversion = 1\n", id="duplicate-section"),
        pytest.param(_CFG, _CFG.replace("name = x", "name = x\nname = y"), id="duplicate-key"),
        pytest.param(_CFG, _CFG + "[flake8]\n  max-line-length = 100\n", id="continuation-first"),
    ],
)
def test_setup_cfg_is_read_as_pytest_reads_it(base: str, after: str) -> None:
    assert runner_sections_changed("setup.cfg", base, after) is not None
    assert runner_sections_changed("setup.cfg", base.encode(), after.encode()) is not None


def test_setup_cfg_bytes_are_decoded_as_pytest_decodes_them() -> None:
    # Not UTF-8: pytest stops with a traceback; a BOM and CRLF line ends are read as pytest
    # reads them (the same sections: unchanged).
    assert runner_sections_changed("setup.cfg", _CFG, _CFG.encode() + b"# \xff\n") is not None
    same = b"\xef\xbb\xbf" + _CFG.replace("\n", "\r\n").encode()
    assert runner_sections_changed("setup.cfg", _CFG, same) is None
    # Comments, blank lines and other sections around [tool:pytest] are not a change.
    noise = "; top\n" + _CFG.replace("[tool:pytest]", "# c\n[tool:pytest] # runner") + "\n[x]\n"
    assert runner_sections_changed("setup.cfg", _CFG, noise) is None


def test_whole_file_runner_configuration_is_reverted_whatever_its_contents() -> None:
    # tox.ini and pytest.ini are not parsed: any change, new or edited, reverts them whole.
    for path in ("tox.ini", "pytest.ini", ".pytest.ini", "pkg/tox.ini", "pytest.toml"):
        for added in (True, False):
            reason = path_reason(path, added=added)
            assert reason is not None and "configuration" in reason, path
    assert path_reason("setup.cfg", added=False) is None


def test_pyproject_runner_tables_in_every_spelling() -> None:
    base = '[project]\nname = "x"\n'
    assert runner_sections_changed("pyproject.toml", base, base + 'version = "2"\n') is None
    for added in (
        '[tool.pytest.ini_options]\naddopts = "-p evil"\n',
        '[tool]\npytest.ini_options.addopts = "-p evil"\n',
        '[tool]\npytest = { ini_options = { addopts = "-p evil" } }\n',
    ):
        assert runner_sections_changed("pyproject.toml", base, base + added) is not None, added


def test_instance_policy_allows_named_paths() -> None:
    inst = Instance(
        instance_id="x-1",
        base_commit="abc",
        test_patch="diff --git a/tests/t.py b/tests/t.py\n",
        FAIL_TO_PASS=[],
        integrity_allow=["tox.ini", "docs/*"],
    )
    policy = RevertPolicy.for_instance(inst)
    chosen = select(
        [
            ("tox.ini", False),
            ("docs/conftest.py", True),
            ("conftest.py", True),
            ("tests/t.py", False),
        ],
        policy,
        ["tests/t.py"],
    )
    assert [(f.path, "test_patch" in f.reason) for f in chosen] == [
        ("conftest.py", False),
        ("tests/t.py", True),
    ]
    assert RevertPolicy.for_instance(inst.model_copy(update={"integrity_allow": None})).allow == []
