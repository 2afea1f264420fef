"""Image names per backend and the override map."""

from __future__ import annotations

from pathlib import Path

import pytest
from requirements import EVAL, need_module

from sandlot.datasets.images import ImageNameError, image_name
from sandlot.sandboxes.images import ImageFamily, image_key, load_image_overrides

ID = "astropy__astropy-12907"


@pytest.mark.parametrize(
    ("family", "backend", "expected"),
    [
        (
            ImageFamily.SWE_BENCH,
            "docker",
            "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
        ),
        (
            ImageFamily.SWE_BENCH,
            "modal",
            "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
        ),
        (
            ImageFamily.SWE_BENCH,
            "vefaas",
            "enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/"
            "sweb.eval.x86_64.astropy_1776_astropy-12907:v2",
        ),
        (
            ImageFamily.SWE_REBENCH,
            "modal",
            "swerebench/sweb.eval.x86_64.astropy_1776_astropy-12907",
        ),
        (
            ImageFamily.SWE_REBENCH,
            "vefaas",
            "enterprise-public-2-cn-beijing.cr.volces.com/swe-rebench/astropy_1776_astropy-12907:latest",
        ),
        (ImageFamily.SWE_BENCH, "local", "host"),
        (ImageFamily.R2E_GYM, "local", "host"),
    ],
)
def test_table(family: ImageFamily, backend: str, expected: str) -> None:
    assert image_name(family, ID, backend) == expected  # type: ignore[arg-type]


def test_key_matches_swebench_instance_image_key() -> None:
    test_spec = need_module("swebench.harness.test_spec.test_spec", EVAL)
    spec = test_spec.TestSpec(
        instance_id="Django__Django-11099",
        repo="django/django",
        version="3.0",
        repo_script_list=[],
        eval_script_list=[],
        env_script_list=[],
        arch="x86_64",
        FAIL_TO_PASS=[],
        PASS_TO_PASS=[],
        language="py",
        docker_specs={},
        namespace="swebench",
    )
    expected = spec.instance_image_key
    assert image_name(ImageFamily.SWE_BENCH, "Django__Django-11099", "docker") == expected
    assert image_key("Django__Django-11099") == "django_1776_django-11099"


def test_r2e_names_come_from_the_row_and_the_commit() -> None:
    commit = "0123456789abcdef"
    source = "namanjain12/aiohttp_final:0123456789abcdef"
    assert (
        image_name(ImageFamily.R2E_GYM, "aiohttp__0123456789", "docker", source_image=source)
        == source
    )
    assert image_name(ImageFamily.R2E_GYM, "aiohttp__0123456789", "vefaas", commit=commit) == (
        "enterprise-public-cn-beijing.cr.volces.com/r2e-gym-subset/0123456789:latest"
    )
    with pytest.raises(ImageNameError, match="docker_image"):
        image_name(ImageFamily.R2E_GYM, "aiohttp__0123456789", "modal")


def test_override_map_wins_for_listed_instances_only(tmp_path: Path) -> None:
    (tmp_path / "o.yaml").write_text(f"{ID}: registry.example/mine:1\n")
    overrides = load_image_overrides(tmp_path / "o.yaml")
    assert image_name(ImageFamily.SWE_BENCH, ID, "vefaas", overrides=overrides) == (
        "registry.example/mine:1"
    )
    assert image_name(ImageFamily.SWE_BENCH, "a__b-1", "docker", overrides=overrides) == (
        "swebench/sweb.eval.x86_64.a_1776_b-1:latest"
    )
    (tmp_path / "bad.json").write_text('{"x": 3}')
    with pytest.raises(ValueError, match=r"bad\.json"):
        load_image_overrides(tmp_path / "bad.json")
