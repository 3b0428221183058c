"""The built-in dqn in spawned runs: its replay ratio kept by the local backend (updates per env
step), the rows, the rows sampled, the target network and the update counter checkpointed, and a
resume with another worker count that carries them on without a second warm-up."""

from __future__ import annotations

import json

import torch

from tests.conftest import cli, read_metrics

#: an update every 4 env steps after 300 (ratio 8 rows sampled per row), workers 8 steps ahead
SMALL = {
    "hidden": [32, 32], "batch_size": 32, "learning_starts": 300, "buffer_size": 6000,
    "steps_per_update": 4, "gradient_steps": 1, "target_update": 50, "exploration_steps": 1000,
}  # fmt: skip
SETS = [f"--set={k}={v}" for k, v in SMALL.items()]


def saved(run_dir) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def test_a_spawned_dqn_keeps_its_ratio_and_resumes_with_another_worker_count(tmp_path):
    run_dir = tmp_path / "run"
    first = cli(
        "run", "--plugin", "dqn", "--workers", "2", "--total-steps", "2000", "--quiet",
        "--run-dir", str(run_dir), *SETS,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = saved(run_dir)
    shared = before["shared_state"]
    assert set(shared) == {"replay", "weights", "target", "updates"}
    replay, updates = shared["replay"], shared["updates"]
    rows = int(replay["heads"].sum())
    assert rows == int(replay["added"]) == before["env_steps"] >= 2000  # a row per step
    assert set(replay) >= {"obs", "action", "reward", "next_obs", "done", "discount"}
    # the ratio: an update per 4 rows after 300, the workers at most 4 rows (+ a step each)
    # ahead of the learner when the run stopped
    assert int(replay["sampled"]) == 32 * updates == 32 * shared["weights"]["version"]
    assert (rows - 300) / 4 - 4 <= updates <= (rows - 300) / 4
    # the target network trails the model (copied every 50 updates: the same when the run
    # stopped right after a copy)
    trails = any(not torch.equal(shared["target"][k], before["model"][k]) for k in before["model"])
    assert trails or updates % 50 == 0

    more = cli(
        "run", "--resume", str(run_dir), "--workers", "3", "--total-steps", "3500", "--quiet"
    )
    assert more.returncode == 0, more.stderr
    after = saved(run_dir)
    now = after["shared_state"]
    assert after["run"]["workers"] == 3 and now["replay"]["heads"].shape == (3,)
    rows_now = int(now["replay"]["heads"].sum())
    assert rows_now == after["env_steps"] >= 3500  # every row kept (6,000 fit), more on top
    # the learner carried on at the ratio from where it was: no second warm-up of 300 rows,
    # no burst of updates for the rows it had learned from
    assert (rows_now - 300) / 4 - 5 <= now["updates"] <= (rows_now - 300) / 4
    learner = [r for r in read_metrics(run_dir) if r["source"] == "trainer" and "updates" in r]
    resumed = max(i for i, r in enumerate(read_metrics(run_dir)) if r.get("event") == "resume")
    later = [r for r in read_metrics(run_dir)[resumed:] if r in learner]
    assert later and min(r["updates"] for r in later) > updates
    assert later[-1]["updates"] == now["updates"]  # the learner's last report: where it ended
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["session"] == 1
