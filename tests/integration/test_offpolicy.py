"""An off-policy algorithm on the schema's transport alone (tests/plugins/mprl_docs_dqn.py): a replay
buffer sized from the config and shaped by the spaces, a target network and an update counter in
the shared state, all kept across a resume; serial and spawned runs."""

from __future__ import annotations

import json

from mprl.host.checkpoint import load
from tests.conftest import cli, read_metrics

SMALL = {"buffer_size": 1000, "learning_starts": 200, "target_every": 50, "batch_size": 32}


def test_dqn_replay_counter_and_target_are_kept_across_a_resume(installed, tmp_path):
    run_dir = tmp_path / "run"
    common = ["--workers", "2", "--quiet", *(f"--set={k}={v}" for k, v in SMALL.items())]
    first = cli(
        "run", "--plugin", "docs-dqn", "--total-steps", "3000", "--run-dir", str(run_dir), *common
    )
    assert first.returncode == 0, first.stderr
    _, before = load(run_dir)
    shared = before["shared_state"]
    assert set(shared) == {"replay", "weights", "target", "updates"}
    assert int(shared["replay"]["heads"].sum()) == before["env_steps"]  # a row per step
    assert shared["updates"] == shared["weights"]["version"] > 0
    again = cli("run", "--resume", str(run_dir), "--total-steps", "5000", "--quiet")
    assert again.returncode == 0, again.stderr
    _, after = load(run_dir)
    new_steps = after["env_steps"] - before["env_steps"]
    assert new_steps > 0 and after["env_steps"] >= 5000
    # the restored rings counted on: nothing was lost and nothing counted twice
    assert int(after["shared_state"]["replay"]["heads"].sum()) == after["env_steps"]
    assert after["shared_state"]["updates"] > shared["updates"]
    assert after["shared_state"]["weights"]["version"] == after["shared_state"]["updates"]
    events = [r.get("event") for r in read_metrics(run_dir)]
    assert "resume" in events and "state-not-restored" not in events
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["session"] == 1 and summary["status"] == "finished"
