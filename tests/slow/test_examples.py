"""The third-party example plugin, installed with pip as a user would, run through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli

SEED = REPO / "examples" / "mprl-seed"


@pytest.fixture(scope="module")
def seed_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("seed-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(SEED)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target


def _with(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_the_seed_example_solves_cartpole_through_the_cli(seed_site, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", "seed", "--workers", "2", "--total-steps", "2000000",
               "--run-dir", str(run_dir), "--quiet", env=_with(seed_site), timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] and summary["stop_reason"] == "solved", summary
