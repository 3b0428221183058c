"""The sac plugin: its policy (the act contract, squashing into the bounds), real serial runs
that learn Pendulum and repeat for a seed, a spawned run resumed with its target critic,
counters, optimizers and replay buffer, and the Discrete action spaces it refuses."""

from __future__ import annotations

import json

import torch

from mprl.host.checkpoint import load
from tests.conftest import cli, read_metrics

TINY = {"hidden": [32, 32], "batch_size": 64, "learning_starts": 300, "buffer_size": 5000}


def test_a_spawned_run_resumes_with_its_target_counters_optimizers_and_replay(tmp_path):
    run_dir = tmp_path / "run"
    sets = [f"--set={k}={v}" for k, v in TINY.items()]
    first = cli(
        "run", "--plugin", "sac", "--workers", "2", "--total-steps", "1500",
        "--run-dir", str(run_dir), "--quiet", *sets,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    _, before = load(run_dir)
    shared = before["shared_state"]
    assert set(shared) == {"replay", "weights", "target", "updates"}
    assert int(shared["replay"]["heads"].sum()) == before["env_steps"]  # a row per step
    updates = shared["updates"]
    assert updates == shared["weights"]["version"] > 0
    assert set(before["optimizers"]) == {"actor", "critic", "alpha"}
    for opt in before["optimizers"].values():  # each Adam stepped once per update
        assert {int(s["step"]) for s in opt["state"].values()} == {updates}
    target = {
        k[len("critic.") :]: v for k, v in shared["target"].items() if k.startswith("critic.")
    }
    critic = {k[len("critic.") :]: v for k, v in before["model"].items() if k.startswith("critic.")}
    assert target.keys() == critic.keys()
    assert all(not torch.equal(target[k], critic[k]) for k in critic)  # trailing, not a copy

    again = cli("run", "--resume", str(run_dir), "--total-steps", "2500", "--quiet")
    assert again.returncode == 0, again.stderr
    _, after = load(run_dir)
    now = after["shared_state"]
    assert after["env_steps"] >= 2500
    assert int(now["replay"]["heads"].sum()) == after["env_steps"]  # the rings counted on
    assert now["updates"] == now["weights"]["version"] > updates
    for opt in after["optimizers"].values():  # the optimizers' state carried on too
        assert {int(s["step"]) for s in opt["state"].values()} == {now["updates"]}
    assert any(not torch.equal(now["target"][k], shared["target"][k]) for k in shared["target"])
    # the resumed learner counts on from the saved updates: no second warm-up from zero
    learner = [r for r in read_metrics(run_dir) if r["source"] == "trainer" and "updates" in r]
    resumed_at = max(i for i, r in enumerate(read_metrics(run_dir)) if r.get("event") == "resume")
    later = [r for r in read_metrics(run_dir)[resumed_at:] if r in learner]
    assert later and min(r["updates"] for r in later) > updates
    events = [r.get("event") for r in read_metrics(run_dir)]
    assert "resume" in events and "state-not-restored" not in events
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["session"] == 1 and summary["status"] == "finished"
