"""The plugin author's docs stay honest: every hook spec documents what it takes and returns,
docs/hooks.md and docs/schema.md match the source, and each documented example works when a
plugin uses it as written."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "mprl_docs_generate", REPO / "docs" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


def test_generate_runs_as_a_script() -> None:
    proc = subprocess.run(
        [sys.executable, "docs/generate.py", "--check"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, "")
