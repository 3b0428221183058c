"""examples/mprl-td3, the off-policy continuous-control example, installed with pip as a user
would: listed, a spawned run through the CLI at its declared replay ratio that resumes, and the
example's own tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mprl.host.checkpoint import load
from tests.conftest import REPO, cli, pip_site, with_site

EXAMPLE = REPO / "examples" / "mprl-td3"
SETS = [
    f"--set={k}={v}"
    for k, v in {
        "hidden": "[32,32]", "batch_size": 64, "learning_starts": 300, "buffer_size": 5000,
    }.items()
]  # fmt: skip


@pytest.fixture(scope="module")
def td3_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/mprl-td3 installed with pip (:func:`tests.conftest.pip_site`)."""
    return pip_site(tmp_path_factory, EXAMPLE)


def test_td3_runs_in_spawned_processes_at_its_replay_ratio_and_resumes(
    td3_site: Path, tmp_path: Path
) -> None:
    env = with_site(td3_site)
    listing = cli("plugins", env=env)
    assert "td3  (mprl-td3 0.1.0)" in listing.stdout, listing.stdout
    run_dir = tmp_path / "run"
    first = cli(
        "run", "--plugin", "td3", "--workers", "2", "--total-steps", "1500",
        "--run-dir", str(run_dir), "--quiet", *SETS, env=env, timeout=240,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    _, before = load(run_dir)
    shared = before["shared_state"]
    assert set(shared) == {"replay", "weights", "target", "updates"}
    assert set(before["optimizers"]) == {"actor", "critic"}
    replay, updates = shared["replay"], shared["updates"]
    assert int(replay["heads"].sum()) == before["env_steps"]  # a row per env step
    assert replay["action"].abs().max() <= 1.0  # stored in the actor's [-1, 1]
    # the declared ratio: a batch of 64 rows per update, one update per row after the warm-up
    assert 0 < updates <= before["env_steps"] - 300 and int(replay["sampled"]) == 64 * updates
    assert shared["weights"]["version"] == updates // 2  # the actor every policy_delay = 2
    # the targets trail the model (Polyak averaging): neither a copy nor the initial weights
    target, model = shared["target"], before["model"]
    assert target.keys() == model.keys()
    assert all(not torch.equal(target[k], model[k]) for k in model if k.startswith("critic."))

    again = cli("run", "--resume", str(run_dir), "--total-steps", "2500", "--quiet", env=env)
    assert again.returncode == 0, again.stderr
    _, after = load(run_dir)
    now = after["shared_state"]
    assert after["env_steps"] >= 2500 and int(now["replay"]["heads"].sum()) == after["env_steps"]
    # the learner went on at the ratio from where it was: no second warm-up, no burst
    assert updates < now["updates"] <= after["env_steps"] - 300
    assert int(now["replay"]["sampled"]) == 64 * now["updates"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["session"] == 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("critic_loss" in r and "actor_loss" in r for r in records)

    discrete = cli("run", "--plugin", "td3", "--env", "CartPole-v1", env=env)
    assert discrete.returncode == 2 and "it supports: Box" in discrete.stderr


def test_the_td3_example_passes_its_own_tests(td3_site: Path) -> None:
    # as its author runs them: `python -m pytest` in the example's directory, the plugin
    # installed; no options of this suite (PYTEST_ADDOPTS) reach that run. All but its learning
    # run (a minute of Pendulum: sac, made of the same lib parts, learns it in tests/slow)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env.update(with_site(td3_site))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", "not learns"],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"rootdir: {EXAMPLE}\nconfigfile: pyproject.toml\ntestpaths: tests\n" in out, out
    assert re.search(r"^=+ \d+ passed, 1 deselected in", proc.stdout, flags=re.MULTILINE), out
