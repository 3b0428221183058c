"""The fault table of docs/faults.md, driven through the real CLI in a subprocess.

Faults come from the test plugin's ``probe`` algorithm (``--set fault=...``). Each test asserts
the exit code, the message, a time bound and, through the autouse ``no_leftovers`` fixture, that
no process (orphans included), shared-memory segment, semaphore or temp file is left.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from mprl.host import checkpoint
from tests.conftest import (
    alive,
    child_pids,
    clean_stderr,
    cli,
    comm,
    read_metrics,
    running,
    wait_for_metrics,
)

STOP_BOUND_S = 5.0  # the supervisor's grace after the stop flag, before the kill


def probe(run_dir: Path, *settings: str, steps: int = 3000, workers: int = 2) -> list[str]:
    args = ["--plugin", "probe", "--workers", str(workers), "--quiet", "--run-dir", str(run_dir)]
    args += ["--total-steps", str(steps), "--set", "step_sleep=0.002"]
    for setting in settings:
        args += ["--set", setting] if "=" in setting and not setting.startswith("--") else [setting]
    return args


def run_probe(run_dir: Path, *settings: str, **kw: Any) -> tuple[int, str, dict, float]:
    start = time.monotonic()
    proc = cli("run", *probe(run_dir, *settings, **kw), timeout=180)
    took = time.monotonic() - start
    clean_stderr(proc.stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    return proc.returncode, proc.stderr, summary, took


def starts(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "started" in r]


def events(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r.get("event") == kind]


# 1: a worker raises
def test_worker_raises(installed, run_dir):
    code, stderr, summary, took = run_probe(
        run_dir, "fault=raise", "fault_rank=1", "fault_at_step=30"
    )
    assert code == 1
    assert "mprl: worker 1 exited with code 1" in stderr
    assert "--- traceback of worker 1 ---" in stderr
    assert "RuntimeError: injected failure in worker:1 (restart 0)" in stderr
    # how soon the run failed is its shutdown_s; the whole run's time, its start-up included,
    # only guards against a hang (a busy machine starts Python and torch slowly)
    assert summary["status"] == "failed" and summary["shutdown_s"] < 2
    assert took < 120


# 2: a worker dies from a signal or os._exit; without restarts the run fails
@pytest.mark.parametrize(
    ("fault", "message"),
    [("sigkill", "worker 1 killed by signal SIGKILL"), ("exit", "worker 1 exited with code 3")],
)
def test_worker_dies_without_restarts(installed, run_dir, fault, message):
    code, stderr, summary, _ = run_probe(
        run_dir, f"fault={fault}", "fault_rank=1", "fault_at_step=30"
    )
    assert code == 1
    assert f"mprl: {message}" in stderr and "Traceback" not in stderr
    assert summary["failures"][0]["rank"] == 1 and summary["restarts"] == [0, 0]


# 2: with restarts the worker comes back on the same rank, fresh seed, and the run goes on
def test_worker_killed_is_restarted_on_its_rank_and_the_run_goes_on(installed, run_dir):
    code, stderr, summary, _ = run_probe(
        run_dir, "fault=sigkill", "fault_rank=1", "fault_at_step=30", "fault_times=1",
        "--max-restarts", "2", "--restart-delay", "0.5", steps=6000,
    )  # fmt: skip
    assert code == 0, stderr
    assert "worker 1 killed by signal SIGKILL; restarting it in 0.5 s (restart 1 of 2)" in stderr
    assert summary["status"] == "finished" and summary["restarts"] == [0, 1]
    assert summary["env_steps"] >= 3000
    (event,) = events(run_dir, "restart")
    assert event["rank"] == 1 and event["reason"] == "killed by signal SIGKILL"
    rank1 = sorted((r for r in starts(run_dir) if r["rank"] == 1), key=lambda r: r["restarts"])
    assert [r["restarts"] for r in rank1] == [0, 1]
    assert rank1[0]["pid"] != rank1[1]["pid"] and rank1[0]["seed"] != rank1[1]["seed"]
    # the restarted worker kept stepping on its rank's counter: well past the 30 steps it died at
    assert summary["per_worker_steps"][1] > 100


# 3: restarts exhausted, per-worker limit
def test_restarts_exhausted(installed, run_dir):
    code, stderr, summary, _ = run_probe(
        run_dir, "fault=raise", "fault_rank=0", "fault_at_step=20",
        "--max-restarts", "1", "--restart-delay", "0.1", steps=10**9,
    )  # fmt: skip
    assert code == 1
    assert "worker 0 exited with code 1; no restarts left (1 of 1 spent)" in stderr
    assert "RuntimeError: injected failure in worker:0 (restart 1)" in stderr
    assert summary["restarts"] == [1, 0]
    assert len(events(run_dir, "restart")) == 1


# 3: restarts exhausted, consecutive failures without a step
def test_consecutive_failures_without_progress_give_up_early(installed, run_dir):
    code, stderr, summary, _ = run_probe(
        run_dir, "fault=exit", "fault_rank=0", "fault_at_step=0",
        "--max-restarts", "5", "--max-consecutive-failures", "2", "--restart-delay", "0.2",
        steps=10**9,
    )  # fmt: skip
    assert code == 1
    assert (
        "worker 0 exited with code 3; failed 2 times in a row without taking a step "
        "(--max-consecutive-failures 2), 1 of 5 restarts spent"
    ) in stderr
    assert summary["restarts"] == [1, 0]


# 4: the train process fails: never restarted, workers stopped
def test_trainer_fails(installed, run_dir):
    code, stderr, summary, took = run_probe(
        run_dir, "trainer_fault=raise", "fault_at_step=200", "--max-restarts", "3", steps=10**9
    )
    assert code == 1
    assert "mprl: trainer exited with code 1" in stderr
    assert "RuntimeError: injected failure in trainer" in stderr
    assert summary["restarts"] == [0, 0] and summary["shutdown_s"] < 2
    assert took < 120  # a hang guard (the run has no step budget), not a speed


# 5: a worker hangs: reported with its rank and its stack, restarted when allowed
def test_hung_worker_is_killed_with_its_stack_and_restarted(installed, run_dir):
    code, stderr, summary, _ = run_probe(
        run_dir, "fault=hang", "fault_rank=0", "fault_at_step=30", "fault_times=1",
        "--worker-timeout", "2", "--max-restarts", "1", "--restart-delay", "0.1", steps=6000,
    )  # fmt: skip
    assert code == 0, stderr
    assert "worker 0 hung: no heartbeat for 2 s (--worker-timeout 2); killed; restarting" in stderr
    assert "stack when it was killed:" in stderr
    assert "in inject" in stderr and "in probe_worker" in stderr  # where it hung
    assert summary["restarts"] == [1, 0] and summary["env_steps"] >= 6000


def test_hung_worker_without_restarts_fails_the_run(installed, run_dir):
    code, stderr, summary, took = run_probe(
        run_dir, "fault=hang", "fault_rank=1", "fault_at_step=30", "--worker-timeout", "2",
        steps=10**9,
    )  # fmt: skip
    assert code == 1
    assert "mprl: worker 1 hung: no heartbeat for 2 s (--worker-timeout 2); killed" in stderr
    assert summary["failures"][0]["rank"] == 1 and summary["shutdown_s"] < STOP_BOUND_S
    assert took < 120  # a hang guard (the run has no step budget), not a speed


def test_hung_trainer_fails_the_run(installed, run_dir):
    code, stderr, _, _ = run_probe(
        run_dir, "trainer_fault=hang", "fault_at_step=100", "--worker-timeout", "2",
        "--max-restarts", "1", steps=10**9,
    )  # fmt: skip
    assert code == 1 and "mprl: trainer hung: no heartbeat" in stderr


# 6: children ignore the stop flag and SIGTERM: killed after a bounded grace
def test_children_ignoring_stop_and_sigterm_are_killed_within_the_bound(installed, run_dir):
    code, stderr, summary, _ = run_probe(
        run_dir, "fault=ignore_stop", "ignore_sigterm=true", steps=300
    )
    assert code == 0, stderr  # the run reached its budget; the kill is reported, not a failure
    assert "worker 0 did not stop within 5 s; killed" in stderr
    assert "trainer did not stop" not in stderr  # it honoured the stop flag
    assert STOP_BOUND_S <= summary["shutdown_s"] < STOP_BOUND_S + 2
    assert (run_dir / "checkpoints" / "last.pt").exists()


# 7: a second Ctrl-C while the first one's shutdown waits forces a fast exit
def test_second_sigint_forces_a_fast_exit(installed, run_dir):
    with running(probe(run_dir, "fault=ignore_stop", steps=10**9)) as proc:
        wait_for_metrics(run_dir, lambda r: "episode_return" in r)
        kids = child_pids(proc.pid)
        proc.send_signal(signal.SIGINT)
        # the first Ctrl-C was taken: the stop flag is up (the train process honours it and
        # says so; the workers ignore it), so the first shutdown is waiting for them
        wait_for_metrics(run_dir, lambda r: "trainer_saw_visits" in r)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - start
    assert proc.returncode == 130, stderr
    # the children were killed at once: the stop's grace periods were cut short, before their
    # first escalation (5 s after the first Ctrl-C); on an idle machine the exit takes under a
    # second, a busy one makes the kill and the checkpoint slower
    assert "forced exit (second Ctrl-C)" in stderr
    assert "did not stop within" not in stderr and took < 30
    clean_stderr(stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["stop_reason"].startswith("second SIGINT")
    # no periodic checkpoint yet (the first is at 60 s): the main process saved one after the
    # children were killed, with the steps its episodes show
    _, saved = checkpoint.load(run_dir)
    assert saved["env_steps"] == summary["env_steps"] > 0
    assert f"the checkpoint holds {summary['env_steps']:,} env steps" in stderr
    episodes = [r for r in read_metrics(run_dir) if "episode_return" in r]
    assert (
        len(episodes) == summary["episodes"]
        and max(r["step"] for r in episodes) <= summary["env_steps"]
    )
    deadline = time.monotonic() + 5  # the resource tracker follows its parent
    while [k for k in kids if alive(k)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in kids if alive(k)]


# 2, from outside: `kill -9` of a worker, with and without restarts
def _worker_pid(proc, rank: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in child_pids(proc.pid):
            if comm(pid) == f"mprl-worker-{rank}":
                return pid
        time.sleep(0.1)
    raise AssertionError(f"worker {rank} never showed up")


@pytest.mark.parametrize("restarts", [0, 1])
def test_worker_killed_from_outside(installed, run_dir, restarts):
    args = probe(run_dir, "--max-restarts", str(restarts), "--restart-delay", "0.2", steps=10**9)
    with running(args) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("source") == "worker:1" and "episode_return" in r)
        os.kill(_worker_pid(proc, 1), signal.SIGKILL)
        if restarts:  # it comes back and steps again; then the user stops the run
            wait_for_metrics(run_dir, lambda r: r.get("rank") == 1 and r.get("restarts") == 1)
            before = json.loads(json.dumps(read_metrics(run_dir)))
            wait_for_metrics(
                run_dir,
                lambda r: r.get("source") == "worker:1" and "episode_return" in r
                and r["wall"] > before[-1]["wall"],
            )  # fmt: skip
            proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - start
    clean_stderr(stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    if restarts:
        assert proc.returncode == 130, stderr
        assert summary["restarts"] == [0, 1] and summary["status"] == "interrupted"
    else:
        assert proc.returncode == 1
        assert "mprl: worker 1 killed by signal SIGKILL" in stderr
        assert took < 10
    assert summary["shutdown_s"] < STOP_BOUND_S
