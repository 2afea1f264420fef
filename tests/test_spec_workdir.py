"""An image's ``WorkingDir`` fills a workdir the caller left unset (``docker run`` without
``-w``), on every backend that reads image configs (``local``, ``docker``): the rule, and
``sandlot.open`` keeping which fields were set."""

from __future__ import annotations

import pytest

import sandlot
from sandlot.sandboxes.spec import SandboxSpec, image_workdir


@pytest.mark.parametrize(
    ("working_dir", "expected"),
    [("/app", "/app"), ("app/src/", "/app/src"), ("", None), ("/", None), ("/testbed", None)],
)
def test_an_unset_workdir_takes_the_images(working_dir: str, expected: str | None) -> None:
    assert image_workdir(SandboxSpec(image="x"), working_dir) == expected


def test_a_workdir_given_wins_even_the_default_one() -> None:
    assert image_workdir(SandboxSpec(image="x", workdir="/testbed"), "/app") is None


def test_open_keeps_which_spec_fields_were_set() -> None:
    assert "workdir" not in sandlot.open("local", image="x").spec.model_fields_set
    assert "workdir" in sandlot.open("local", image="x", workdir="/testbed").spec.model_fields_set
    spec = SandboxSpec(image="x", workdir="/w")
    assert "workdir" in sandlot.open("local", spec, env={"A": "1"}).spec.model_fields_set
