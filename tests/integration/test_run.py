"""Real runs through the Python API: spawned processes, real environments, a real Manager."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import mprl
from mprl.host.plugins import get_plugin_manager
from tests.conftest import read_metrics


def test_a3c_short_run_updates_the_shared_model_and_writes_the_run_dir(run_dir):
    summary = mprl.run(
        "a3c", workers=2, total_steps=20_000, seed=3, run_dir=run_dir, progress="none"
    )
    assert summary.status == "finished" and summary.stop_reason == "total steps reached"
    assert summary.env_steps >= 20_000 and summary.episodes > 0
    assert len(summary.per_worker_steps) == 2 and min(summary.per_worker_steps) > 0
    assert summary.exit_code == 0

    # the shared model changed: compare the final checkpoint with the seeded initial weights
    pm = get_plugin_manager()
    _, algo = pm.algorithm("a3c")
    config = algo.config_cls()
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        initial = algo.make_model(env.observation_space, env.action_space, config)
    env.close()
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["algorithm"] == "a3c" and ckpt["env_steps"] == summary.env_steps
    changed = [k for k, v in initial.state_dict().items() if not torch.equal(v, ckpt["model"][k])]
    assert changed, "no parameter of the shared model changed"
    assert ckpt["optimizer"]["state"], "the shared Adam state was not saved"
    # Adam's step counts are shared: each count is the number of updates by all workers
    steps = [float(s["step"]) for s in ckpt["optimizer"]["state"].values()]
    assert min(steps) >= summary.env_steps // (config.envs_per_worker * config.n_steps) - 2

    metrics = read_metrics(run_dir)
    sources = {r["source"] for r in metrics if "episode_return" in r}
    assert sources and sources <= {"worker:0", "worker:1"}
    assert sum("episode_return" in r for r in metrics) == summary.episodes
    assert all(r["wall"] >= 0 and r["step"] >= 0 for r in metrics)
    # metrics.csv: the same numbers in long format, a row per numeric value of each record
    with (run_dir / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    expected = [
        (str(r["wall"]), str(r["step"]), r["source"], k, str(v))
        for r in metrics
        for k, v in r.items()
        if k not in ("wall", "step", "source") and isinstance(v, int | float)
    ]
    assert [(r["wall"], r["step"], r["source"], r["name"], r["value"]) for r in rows] == expected
    assert {r["name"] for r in rows} >= {"episode_return", "episode_length", "policy_loss"}

    written = json.loads((run_dir / "summary.json").read_text())
    for key in ("solved", "env_steps", "episodes", "wall_s", "mean_return_100"):
        assert key in written
    assert written["env_steps"] == summary.env_steps
    config_json = json.loads((run_dir / "config.json").read_text())
    assert config_json["run"]["workers"] == 2 and config_json["config"]["lr"] == config.lr
    assert config_json["reward_threshold"] == 475.0


def test_entry_point_plugin_runs_inside_spawned_workers(installed, run_dir):
    # both workers step for about a second: each reports episodes whatever the scheduler does
    summary = mprl.run(
        "probe",
        workers=2,
        total_steps=2000,
        config={"step_sleep": 0.001},
        run_dir=run_dir,
        progress="none",
    )
    records = read_metrics(run_dir)
    envs = {(r["rank"], r["env"], r["pid"]) for r in records if "env" in r}
    ranks = {rank for rank, _, _ in envs}
    assert ranks == {0, 1}
    # Corridor-v0 only exists through the plugin's mprl_make_env hook, loaded in each child
    assert {env for _, env, _ in envs} == {"Corridor"}
    pids = {pid for _, _, pid in envs}
    assert len(pids) == 2 and os.getpid() not in pids
    (trainer,) = [r for r in records if r["source"] == "trainer"]
    # the train process read the shared state the workers wrote (Manager list and shared tensor)
    assert trainer["trainer_saw_visits"] >= 2
    assert trainer["trainer_seen"] == pytest.approx(summary.env_steps, abs=4)


def _starts(run_dir: Path) -> dict[int, dict]:
    return {r["rank"]: r for r in read_metrics(run_dir) if "started" in r}


def test_seeds_threads_and_start_interval(installed, tmp_path):
    def go(name: str, **kw: object) -> dict[int, dict]:
        mprl.run(
            "probe", workers=2, total_steps=100, run_dir=tmp_path / name, progress="none", **kw
        )
        return _starts(tmp_path / name)

    first = go("a", seed=5, start_interval=3.0)
    again = go("b", seed=5, torch_threads=2)
    other = go("c", seed=6)
    # per-process seeds derive from the run seed: distinct per rank, stable per run seed
    assert first[0]["seed"] != first[1]["seed"]
    assert [first[r]["seed"] for r in (0, 1)] == [again[r]["seed"] for r in (0, 1)]
    assert {other[r]["seed"] for r in (0, 1)}.isdisjoint({first[r]["seed"] for r in (0, 1)})
    # two cores shared by two workers and a train process: one torch thread each by default
    assert {first[r]["threads"] for r in (0, 1)} == {1}
    assert {again[r]["threads"] for r in (0, 1)} == {2}
    # worker 1's process was created 3 s after worker 0's (the creation times, not "started":
    # that is logged after the imports, whose time varies by seconds on a busy machine); with
    # no start interval, right after it
    assert first[1]["created"] - first[0]["created"] >= 3.0 - 0.02  # clock ticks: 10 ms
    assert abs(other[1]["created"] - other[0]["created"]) < 1.0


def test_worker_crash_stops_the_run_with_its_traceback(installed, run_dir, capfd):
    start = time.monotonic()
    with pytest.raises(mprl.RunFailed, match=r"worker \d exited with code 1") as err:
        mprl.run(
            "probe",
            workers=2,
            config={"fault": "raise", "fault_at_step": 25},
            run_dir=run_dir,
            progress="none",
        )
    assert time.monotonic() - start < 30
    stderr = capfd.readouterr().err
    assert "--- traceback of worker" in stderr
    assert "RuntimeError: injected failure in worker:" in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_code"] == 1
    assert err.value.summary.failures[0].traceback


def test_a_worker_that_exits_with_a_code_is_reported_with_it(installed, run_dir):
    with pytest.raises(mprl.RunFailed, match=r"worker \d exited with code 3"):
        mprl.run(
            "probe",
            workers=1,
            config={"fault": "exit", "fault_at_step": 10},
            run_dir=run_dir,
            progress="none",
        )


def test_bad_input_starts_nothing(installed, run_dir):
    with pytest.raises(mprl.errors.UsageError, match="does not support the action space"):
        mprl.run("a3c", env="Switches-v0", run_dir=run_dir, progress="none")
    with pytest.raises(mprl.ConfigError, match="fault_at_stepp"):
        mprl.run("probe", config={"fault_at_stepp": 1}, run_dir=run_dir, progress="none")
    assert not run_dir.exists()


def test_missing_main_guard_gets_an_explanation(installed, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import mprl\n"
        f"mprl.run('probe', workers=1, total_steps=50, run_dir={str(tmp_path / 'r')!r}, progress='none')\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode != 0
    assert 'if __name__ == "__main__":' in proc.stderr
