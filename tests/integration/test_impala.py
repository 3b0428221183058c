"""The impala plugin: V-trace, its update, and real runs through the CLI (a worker killed and
restarted, no Manager call per step)."""

from __future__ import annotations

import json
import pstats
import signal

import pytest

from mprl_builtin.impala.algorithm import COUNT_EVERY_S, ImpalaConfig
from tests.conftest import (
    cli,
    kill_worker_and_wait_for_restart,
    read_metrics,
    running,
    wait_for_metrics,
    wait_until,
)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_short_impala_run_through_the_cli(tmp_path, env):
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "impala", "--env", env, "--workers", "2", "--total-steps", "40000",
        "--run-dir", str(run_dir), "--quiet", "--set", "envs_per_worker=8",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 40000 and min(summary["per_worker_steps"]) > 0
    learner = [r for r in read_metrics(run_dir) if r["source"] == "trainer"]
    assert learner and learner[-1]["updates"] > 10
    assert all(0 <= r["staleness"] < 20 for r in learner)
    # the per-worker counters in the Manager (control state) saw every worker hand rollouts over
    assert learner[-1]["rollouts_min"] > 0
    episodes = [r for r in read_metrics(run_dir) if "episode_return" in r]
    assert {r["source"] for r in episodes} == {"worker:0", "worker:1"}


def test_impala_worker_killed_mid_run_is_restarted_and_learning_goes_on(tmp_path):
    # one slot per worker: if the dead worker left its slot or any lock behind, its restart
    # could not hand a rollout over again
    run_dir = tmp_path / "run"
    args = [
        "--plugin", "impala", "--workers", "2", "--total-steps", "1e9", "--run-dir", str(run_dir),
        "--quiet", "--max-restarts", "1", "--restart-delay", "0.2",
        "--set", "slots_per_worker=1", "--set", "batch_rollouts=2", "--set", "lr=1e-6",
    ]  # fmt: skip
    config = ImpalaConfig()

    def steps_after_restart(metrics: list[dict]) -> int:
        """Env steps worker 1 finished episodes with since its restart (a summed-up record,
        of a fast run past its budget of episode records, stands for episode_count episodes
        of the mean length)."""
        after = [r for r in metrics if r["source"] == "worker:1" and r["wall"] > restart["wall"]]
        return sum(r.get("episode_length", 0) * r.get("episode_count", 1) for r in after)

    def updates(metrics: list[dict]) -> int:
        return max(r["updates"] for r in metrics if "updates" in r)

    with running(args) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("source") == "worker:1")
        restart = kill_worker_and_wait_for_restart(proc, run_dir, 1)
        # the learner updates after the restart, from both workers' rollouts
        wait_for_metrics(
            run_dir,
            lambda r: r.get("source") == "trainer" and r["wall"] > restart["wall"]
            and r["rollouts_min"] > 0,
        )  # fmt: skip
        updates_then = updates(read_metrics(run_dir))
        # and goes on updating, while the restarted worker steps on through more than two
        # rollouts (its one slot came back): waited for, then the user stops the run
        wait_until(
            lambda: (
                updates(m := read_metrics(run_dir)) > updates_then
                and steps_after_restart(m) > 2 * config.unroll * config.envs_per_worker
            ),
            "more updates and steps of the restarted worker",
        )
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    metrics = read_metrics(run_dir)
    assert updates(metrics) > updates_then
    assert steps_after_restart(metrics) > 2 * config.unroll * config.envs_per_worker
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == [0, 1]


def test_a_profiled_impala_worker_makes_no_manager_call_per_step(tmp_path):
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "impala", "--workers", "2", "--total-steps", "30000", "--quiet",
        "--run-dir", str(run_dir), "--set", "envs_per_worker=8", env={"MPRL_PROFILE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    steps = json.loads((run_dir / "summary.json").read_text())["per_worker_steps"][0]
    profile = pstats.Stats(str(run_dir / "logs" / "worker-0.prof"))
    stats = profile.stats  # type: ignore[attr-defined]

    def calls(file_part: str, name: str) -> int:
        return sum(v[1] for (f, _, fn), v in stats.items() if file_part in f and fn == name)

    env_steps = calls("cartpole.py", "step")
    assert env_steps >= steps > 0  # the profile covers the per-step path
    rollouts = steps // (8 * 16)
    manager_calls = calls("managers.py", "_callmethod")
    # the per-worker counter: read at the start, written once a second and at the end; none
    # per step, none per rollout
    seconds = profile.total_tt  # type: ignore[attr-defined]
    assert manager_calls <= seconds / COUNT_EVERY_S + 3 < rollouts, (
        manager_calls,
        seconds,
        rollouts,
    )
