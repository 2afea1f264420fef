"""Canonical image names → each backend's registry name, with override maps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandlot.sandboxes.images import backend_image

SWE = "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
REBENCH = "swerebench/sweb.eval.x86_64.encode_1776_httpx-2701"
R2E = "namanjain12/aiohttp_final:0123456789abcdef0123"


@pytest.mark.parametrize(
    ("image", "backend", "expected"),
    [
        (SWE, "docker", SWE),
        (SWE, "modal", SWE),
        (
            SWE,
            "vefaas",
            "enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/"
            "sweb.eval.x86_64.astropy_1776_astropy-12907:v2",
        ),
        (
            REBENCH,
            "vefaas",
            "enterprise-public-2-cn-beijing.cr.volces.com/swe-rebench/encode_1776_httpx-2701:latest",
        ),
        (
            R2E,
            "vefaas",
            "enterprise-public-cn-beijing.cr.volces.com/r2e-gym-subset/0123456789:latest",
        ),
        (R2E, "modal", R2E),
        ("python:3.12", "vefaas", "python:3.12"),
        ("ghcr.io/me/private:1", "vefaas", "ghcr.io/me/private:1"),
        (SWE, "local", SWE),
    ],
)
def test_table(image: str, backend: str, expected: str) -> None:
    assert backend_image(image, backend) == expected


def test_overrides_option_then_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "images.json"
    path.write_text(json.dumps({SWE: "mirror.local/swe:1", "python:3.12": "mirror.local/py:3.12"}))
    monkeypatch.setenv("SANDLOT_IMAGE_OVERRIDES", str(path))
    assert backend_image(SWE, "vefaas") == "mirror.local/swe:1"
    assert backend_image("python:3.12", "modal") == "mirror.local/py:3.12"
    assert backend_image(SWE, "vefaas", {SWE: "option/wins:1"}) == "option/wins:1"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="image override map"):
        backend_image(SWE, "vefaas")
