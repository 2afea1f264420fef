"""What an ``image=`` string of the local backend names."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.images.reference import is_image_reference, parse

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "source", "registry", "plain_http"),
    [
        ("python:3.12", "docker://python:3.12", "docker.io", False),
        ("swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
         "docker://swebench/sweb.eval.x86_64.django_1776_django-11099:latest", "docker.io", False),
        (f"registry.example:5000/x@{DIGEST}", f"docker://registry.example:5000/x@{DIGEST}",
         "registry.example:5000", False),
        ("127.0.0.1:5000/a/b:1", "docker://127.0.0.1:5000/a/b:1", "127.0.0.1:5000", True),
        ("localhost/x", "docker://localhost/x", "localhost", True),
        ("docker://quay.io/x:1", "docker://quay.io/x:1", "quay.io", False),
        ("oci:/some/dir:tag", "oci:/some/dir:tag", None, False),
        ("docker-archive:/a.tar", "docker-archive:/a.tar", None, False),
    ],
)  # fmt: skip
def test_references(image: str, source: str, registry: str | None, plain_http: bool) -> None:
    ref = parse(image)
    assert ref is not None
    assert (ref.source, ref.registry, ref.plain_http) == (source, registry, plain_http)


def test_host_and_directories_are_not_references(tmp_path: Path) -> None:
    for image in ("host", "/abs/rootfs", "./rel", str(tmp_path)):
        assert parse(image) is None and not is_image_reference(image)


def test_an_invalid_name_is_a_reference_whose_parse_says_why() -> None:
    assert is_image_reference("Upper/Case")
    with pytest.raises(ValueError, match="neither 'host'"):
        parse("Upper/Case")
