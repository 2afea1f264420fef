"""swe-mini's rows beside empty directories at their ``repo_source`` paths, for CLI tests that
stop before (or fail at) the repository: the commands refuse a row whose repository source does
not exist before anything runs, and ``examples/swe-mini/repos`` exists only once
``make_repos.py`` has run."""

from __future__ import annotations

import json
from pathlib import Path

SWE_MINI_ROWS = Path(__file__).resolve().parents[1] / "examples" / "swe-mini" / "instances.jsonl"


def swe_mini_copy(dest: Path) -> Path:
    """Write swe-mini's ``instances.jsonl`` into ``dest`` (a directory), make an empty
    directory at each row's ``repo_source``, and return the copy's path."""
    text = SWE_MINI_ROWS.read_text()
    for line in text.splitlines():
        (dest / json.loads(line)["repo_source"]).mkdir(parents=True, exist_ok=True)
    copy = dest / "instances.jsonl"
    copy.write_text(text)
    return copy
