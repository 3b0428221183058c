"""The third-party example plugin, installed with pip as a user would, run through the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SEED, cli, pip_site, with_site

EXAMPLE = REPO / "examples" / "mprl-reinforce"
EXAMPLE_TESTS = 14  # tests in examples/mprl-reinforce/tests, parametrized cases counted


@pytest.fixture(scope="module")
def reinforce_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_site(tmp_path_factory, EXAMPLE)


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


def test_the_example_passes_its_own_tests(
    reinforce_site: Path, record_property: pytest.RecordProperty
) -> None:
    # as its author runs them: `python -m pytest` in the example's directory, the plugin
    # installed; no options of this suite (PYTEST_ADDOPTS) reach that run
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(reinforce_site), os.environ.get("PYTHONPATH", "")])
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    wall = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # the example's pyproject.toml makes it the rootdir: this repository's pytest settings
    # (addopts, the timeout) and tests/conftest.py play no part
    assert f"rootdir: {EXAMPLE}\nconfigfile: pyproject.toml\ntestpaths: tests\n" in out, out
    assert "timeout:" not in out, out
    summary = re.search(r"^=+ (\d+) passed in ([\d.]+)s", out, flags=re.MULTILINE)
    assert summary and int(summary.group(1)) == EXAMPLE_TESTS, out
    record_property("example_tests_wall_s", round(wall, 2))
    print(
        f"examples/mprl-reinforce: {summary.group(1)} tests passed in {summary.group(2)} s "
        f"(pytest's count), {wall:.1f} s wall with interpreter start-up"
    )


def test_the_seed_example_passes_its_own_tests(seed_site: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env.update(with_site(seed_site))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"],
        cwd=SEED, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^=+ 5 passed in", proc.stdout, flags=re.MULTILINE), proc.stdout


def test_the_seed_example_runs_in_spawned_processes_and_stops_its_waits(seed_site, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", "seed", "--workers", "2", "--total-steps", "20000",
               "--run-dir", str(run_dir), "--quiet", env=with_site(seed_site))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 20000 and min(summary["per_worker_steps"]) > 0
    # the learner waited in ctx.get and the workers in ctx.put when the run stopped: both
    # left their waits, no SIGTERM was needed
    assert summary["shutdown_s"] < 2 and "sending SIGTERM" not in proc.stderr
    losses = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in losses if "loss" in r]
