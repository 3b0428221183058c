"""The plugin author's docs stay honest: every hook spec documents what it takes and returns,
docs/hooks.md and docs/schema.md match the source, and each documented example works when a
plugin uses it as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_generate_runs_as_a_script() -> None:
    proc = subprocess.run(
        [sys.executable, "docs/generate.py", "--check"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, "")
