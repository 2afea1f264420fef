"""Shared paths and helpers of the dataset preprocessing tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repo_paths import REPO

from sandlot.datasets.images import ImageBackend
from sandlot.datasets.prepare import PrepareOptions, PrepareResult, Preprocessor, prepare
from sandlot.datasets.r2e_gym_subset import PREPROCESSOR as R2E
from sandlot.datasets.swe_bench_verified import PREPROCESSOR as SWE_BENCH
from sandlot.datasets.swe_rebench import PREPROCESSOR as SWE_REBENCH

ROOT = REPO
EXAMPLES = ROOT / "examples" / "swe-mini"
FIXTURES = ROOT / "tests" / "fixtures" / "datasets"
PREPROCESSORS: dict[str, Preprocessor] = {p.name: p for p in (SWE_BENCH, SWE_REBENCH, R2E)}
MINICALC_BASE = "f79e0958e0d75b95d5671c791475f100a7390364"
MINICALC_LATER = "bf63c81552bef6782859a6a50551bc0c66a7be6e"
"""The second commit of ``repos/minicalc``, after the base of ``minicalc__minicalc-1``."""


def fixture_rows(name: str) -> list[dict[str, Any]]:
    """The source rows of ``tests/fixtures/datasets/<name>.jsonl``."""
    lines = (FIXTURES / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_prepare(
    name: str,
    out: Path,
    backend: ImageBackend,
    *,
    input: str | Path | None = None,
    **options: Any,
) -> PrepareResult:
    """Prepare ``name`` from ``input`` (default: its fixture) into ``out``."""
    source = input if input is not None else FIXTURES / f"{name}.jsonl"
    return prepare(
        PREPROCESSORS[name],
        PrepareOptions(local_save_dir=out, backend=backend, input=str(source), **options),
    )
