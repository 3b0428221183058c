"""examples/mprl-tom2c, the seed program (ToM2C) as a third-party plugin, installed with pip as a
user would: a short multi-agent run through the CLI, and the example's own tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli, pip_site, with_site

pytest.importorskip("mpe2", reason="the marl extra (pettingzoo, mpe2) is not installed")

EXAMPLE = REPO / "examples" / "mprl-tom2c"


@pytest.fixture(scope="module")
def tom2c_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/mprl-tom2c installed with pip (:func:`tests.conftest.pip_site`)."""
    return pip_site(tmp_path_factory, EXAMPLE)


def test_tom2c_installs_and_runs_with_spawned_workers(tom2c_site: Path, tmp_path: Path) -> None:
    env = with_site(tom2c_site)
    listing = cli("plugins", env=env)
    assert "tom2c  (mprl-tom2c 0.2.0)" in listing.stdout, listing.stdout
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "tom2c", "--env", "mpe2:simple_spread_v3", "--workers", "2",
        "--total-steps", "2000", "--run-dir", str(run_dir), "--quiet", env=env, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] >= 2000
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "tom_accuracy" in r]
    assert updates and all(0.0 <= r["tom_accuracy"] <= 1.0 for r in updates)
    assert any("return_agent_0" in r for r in records)  # each agent's episode return
    assert all(0.0 <= r["messages_per_step"] <= 6.0 for r in updates)  # 3 agents: 6 pairs
    played = cli("eval", str(run_dir), "--episodes", "2", env=env, timeout=120)
    assert played.returncode == 0, played.stderr
    assert json.loads((run_dir / "eval.json").read_text())["episodes"] == 2
    single = cli("run", "--plugin", "tom2c", "--env", "CartPole-v1", env=env)
    assert single.returncode == 2 and "multi-agent" in single.stderr


def test_the_tom2c_example_passes_its_own_tests(tom2c_site: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env.update(with_site(tom2c_site))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^=+ \d+ passed in", proc.stdout, flags=re.MULTILINE), proc.stdout
