"""The A3C plugin's pieces, checked against independent computations, and a Box-action run."""

from __future__ import annotations

import json

import mprl


def test_a3c_runs_on_a_box_action_space(tmp_path):
    run_dir = tmp_path / "run"
    summary = mprl.run(
        "a3c",
        env="Pendulum-v1",
        workers=2,
        total_steps=1600,
        config={"envs_per_worker": 2},
        run_dir=run_dir,
        progress="none",
    )
    assert summary.env_steps >= 1600 and summary.episodes >= 4  # Pendulum: 200-step episodes
    returns = [
        json.loads(line)["episode_return"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "episode_return" in line
    ]
    assert all(-2000 < r <= 0 for r in returns)  # Pendulum's reward is in [-16.3, 0] per step
    assert not summary.solved and summary.stop_reason == "total steps reached"
