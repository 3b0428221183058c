"""The built-in vdn and qmix through the CLI: a spawned vdn run keeps its declared replay ratio,
checkpoints the replay buffer, the target networks and the update counter, and a resume carries
them on without a second warm-up; a serial qmix run loads and plays its greedy agents
(``mprl.load(run).act``) and exports them (``mprl export``)."""

from __future__ import annotations

import numpy as np
import torch

import mprl
from tests.conftest import cli

ENV = "mpe2:simple_spread_v3(N=2, max_cycles=25)"
#: an update every 4 team steps after 300 (16 rows sampled per row collected)
SMALL = {
    "hidden": [32, 32], "batch_size": 64, "learning_starts": 300, "buffer_size": 6000,
    "steps_per_update": 4, "gradient_steps": 1, "target_update": 50, "exploration_steps": 1000,
}  # fmt: skip
SETS = [f"--set={k}={v}" for k, v in SMALL.items()]


def saved(run_dir) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def test_a_spawned_vdn_keeps_its_ratio_and_resumes_where_it_was(tmp_path):
    run_dir = tmp_path / "run"
    first = cli("run", "--plugin", "vdn", "--env", ENV, "--workers", "2", "--total-steps", "2500",
                "--quiet", "--run-dir", str(run_dir), *SETS)  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = saved(run_dir)
    shared = before["shared_state"]
    assert set(shared) == {"replay", "weights", "target", "updates"}
    replay, updates = shared["replay"], shared["updates"]
    rows = int(replay["heads"].sum())
    assert rows == int(replay["added"]) == before["env_steps"] >= 2500  # a row per team step
    assert set(replay) >= {"obs", "state", "action", "reward", "next_obs", "next_state", "done"}
    assert replay["obs"].shape[1:] == replay["next_obs"].shape[1:] == (2, 12)
    assert replay["action"].shape[1:] == (2,) and replay["state"].shape[1:] == (24,)
    # simple_spread only ever ends at its time limit: no row is terminal
    assert not replay["done"].any()
    assert int(replay["sampled"]) == 64 * updates == 64 * shared["weights"]["version"]
    assert (rows - 300) / 4 - 4 <= updates <= (rows - 300) / 4
    trails = any(not torch.equal(shared["target"][k], before["model"][k]) for k in before["model"])
    assert trails or updates % 50 == 0

    more = cli("run", "--resume", str(run_dir), "--total-steps", "4000", "--quiet")
    assert more.returncode == 0, more.stderr
    now = saved(run_dir)["shared_state"]
    rows_now = int(now["replay"]["heads"].sum())
    assert rows_now == saved(run_dir)["env_steps"] >= 4000  # every row kept, more on top
    # on at the ratio from where it was: no second warm-up of 300 rows
    assert (rows_now - 300) / 4 - 5 <= now["updates"] <= (rows_now - 300) / 4
    assert int(now["replay"]["sampled"]) == 64 * now["updates"]


def test_a_qmix_run_loads_plays_its_greedy_agents_and_exports(tmp_path):
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", "qmix", "--env", ENV, "--serial", "--total-steps", "1500",
               "--quiet", "--run-dir", str(run_dir), *SETS)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shared = saved(run_dir)["shared_state"]
    assert any(k.startswith("mixer.hyper_w1") for k in shared["target"])  # QMIX's mixer
    policy = mprl.load(run_dir)
    obs = torch.randn(6, 2, 12)
    greedy = policy.act(obs, deterministic=True)
    assert greedy.shape == (6, 2) and ((greedy >= 0) & (greedy < 5)).all()
    q = policy.model.q_values(obs)
    np.testing.assert_array_equal(greedy, q.argmax(-1).numpy())
    out = tmp_path / "qmix.pt"
    exported = cli("export", str(run_dir), "-o", str(out), "--format", "torchscript")
    assert exported.returncode == 0, exported.stderr
    played = torch.jit.load(str(out))(obs)
    np.testing.assert_array_equal(played.numpy(), greedy)
    ev = cli("eval", str(run_dir), "--episodes", "2", "--seed", "3")
    assert ev.returncode == 0, ev.stderr
    assert "per agent: agent_0 " in ev.stdout
