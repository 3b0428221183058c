"""The third-party example plugin, installed with pip as a user would, run through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli


@pytest.fixture(scope="module")
def reinforce_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("reinforce-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(REPO / "examples" / "mprl-reinforce")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target


def test_example_plugin_installs_and_runs_in_spawned_workers(reinforce_site, tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(reinforce_site), os.environ.get("PYTHONPATH", "")])}
    listing = cli("plugins", env=env)
    assert "reinforce  (mprl-reinforce 0.1.0)" in listing.stdout
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "reinforce", "--workers", "2", "--total-steps", "3000",
        "--run-dir", str(run_dir), "--quiet", env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 3000 and summary["episodes"] > 10
    unsupported = cli("run", "--plugin", "reinforce", "--env", "Pendulum-v1", env=env)
    assert unsupported.returncode == 2 and "supports: Discrete" in unsupported.stderr
