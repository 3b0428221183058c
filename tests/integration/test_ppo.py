"""The ppo plugin: GAE, the synchronous barrier between workers and learner, real CLI runs."""

from __future__ import annotations

import json
import signal

import pytest

from mprl_builtin.ppo import PPOConfig
from tests.conftest import (
    cli,
    kill_worker_and_wait_for_restart,
    read_metrics,
    running,
    wait_for_metrics,
)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_ppo_workers_collect_in_lockstep_and_lr_anneals(tmp_path, env):
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "ppo", "--env", env, "--workers", "2", "--total-steps", "30000",
        "--run-dir", str(run_dir), "--quiet", "--set", "anneal_steps=40000",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    rollout = PPOConfig().n_steps * PPOConfig().envs_per_worker
    per_worker = summary["per_worker_steps"]
    # one rollout per worker per policy version: neither worker runs ahead of the other
    assert per_worker[0] > 10 * rollout and abs(per_worker[0] - per_worker[1]) <= rollout
    assert all(steps % rollout == 0 for steps in per_worker)
    learner = [r for r in read_metrics(run_dir) if r["source"] == "trainer"]
    assert learner, "the learner never reported"
    for record in learner:  # linear annealing by env steps (the step counted before the update)
        expected = 1e-3 * max(0.05, 1 - record["step"] / 40000)
        assert record["lr"] <= 1e-3 * (1 - (record["step"] - 2 * rollout) / 40000) + 1e-9
        assert record["lr"] >= expected - 1e-9
        assert 0.0 <= record["clip_fraction"] <= 1.0
    episodes = [r for r in read_metrics(run_dir) if "episode_return" in r]
    assert {r["source"] for r in episodes} == {"worker:0", "worker:1"}


def test_a_seeded_ppo_run_with_two_workers_repeats_episode_for_episode(tmp_path):
    def episodes(run_dir) -> dict[str, list[float]]:
        proc = cli("run", "--plugin", "ppo", "--workers", "2", "--seed", "3", "--total-steps",
                   "20000", "--run-dir", str(run_dir), "--quiet")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out: dict[str, list[float]] = {"worker:0": [], "worker:1": []}
        for record in read_metrics(run_dir):
            if "episode_return" in record:
                out[record["source"]].append(record["episode_return"])
        return out

    first, again = episodes(tmp_path / "a"), episodes(tmp_path / "b")
    for source, returns in first.items():
        # the runs stop at slightly different steps; up to there they are the same run,
        # whichever worker handed its rollouts in first in each iteration
        common = min(len(returns), len(again[source]))
        assert common >= 100, (source, common)
        assert returns[:common] == again[source][:common], source


def test_ppo_worker_killed_mid_run_is_restarted_and_the_barrier_holds(tmp_path):
    # the learner waits for both workers' rollouts every iteration: had the killed worker left
    # its slot behind, or the restarted one waited for a version that never comes, it would hang
    run_dir = tmp_path / "run"
    args = [
        "--plugin", "ppo", "--workers", "2", "--total-steps", "1e9", "--run-dir", str(run_dir),
        "--quiet", "--max-restarts", "1", "--restart-delay", "0.2", "--set", "lr=1e-6",
    ]  # fmt: skip
    with running(args) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("source") == "trainer")
        restart = kill_worker_and_wait_for_restart(proc, run_dir, 1)
        # episodes from the new worker 1, and the learner iterating after them
        wait_for_metrics(
            run_dir, lambda r: r.get("source") == "worker:1" and r["wall"] > restart["wall"] + 1
        )
        before = max(r["step"] for r in read_metrics(run_dir) if r["source"] == "trainer")
        wait_for_metrics(
            run_dir, lambda r: r.get("source") == "trainer" and r["step"] > before + 10_000
        )
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == [0, 1]
