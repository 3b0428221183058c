"""The third-party example plugin, installed with pip as a user would, run through the CLI."""

from __future__ import annotations

import json

from tests.conftest import cli, with_site


def test_the_seed_example_solves_cartpole_through_the_cli(seed_site, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", "seed", "--workers", "2", "--total-steps", "2000000",
               "--run-dir", str(run_dir), "--quiet", env=with_site(seed_site), timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] and summary["stop_reason"] == "solved", summary
