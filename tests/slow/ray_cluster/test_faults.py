"""Faults on the cluster: a killed actor, a crash, a hang, and signals to the driver (joined to
the cluster, or with its own embedded Ray). Lost and cut-off nodes: ``test_faults_nodes.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mprl.backends.supervisor import Supervisor
from mprl_builtin.ray.backend import ACTORS_GONE_S
from tests.conftest import clean_stderr, cli, end, read_metrics, running, wait_for_metrics
from tests.slow.ray_cluster import WORKER, placed, ray_processes, run_ray

ray = pytest.importorskip("ray")


def test_a_sigkilled_worker_actor_is_restarted_and_sigint_stops_the_run_leaving_no_actor(
    cluster, tmp_path
):
    """A worker's actor SIGKILLed: restarted on its rank (on a node with room). Then a Ctrl-C
    to the driver: a clean stop within its own bounds, a final checkpoint of every step, and no
    actor process left once the driver has exited."""
    run_dir = tmp_path / "run"
    args = ["--backend", "ray", "--ray-address", cluster.address, "--plugin", "relay",
            "--workers", "2", *WORKER, "--max-restarts", "1", "--total-steps", "400000",
            "--set", "step_sleep=0.001", "--run-dir", str(run_dir)]  # fmt: skip
    with running(args) as proc:
        records = wait_for_metrics(
            run_dir, lambda r: r.get("event") == "placed" and r["rank"] == 1, timeout=120
        )
        wait_for_metrics(run_dir, lambda r: "episode_return" in r, timeout=120)
        victim = placed(records)["worker 1"]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for_metrics(run_dir, lambda r: r.get("event") == "restart", timeout=60)
        records = wait_for_metrics(
            run_dir,
            lambda r: r.get("event") == "placed" and r["rank"] == 1 and r["pid"] != victim,
            timeout=120,
        )
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    assert proc.returncode == 130, stderr
    restart = next(r for r in read_metrics(run_dir) if r.get("event") == "restart")
    assert restart["rank"] == 1 and "its actor died" in restart["message"]
    # within the stop's own bounds (the children's grace, the final state's read of a train
    # process still running, the wait for the actors to be gone), not a call's 60 s timeout;
    # a loaded suite took 10.4 s
    assert took < 2 * Supervisor.stop_grace_s + ACTORS_GONE_S, took
    clean_stderr(stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert summary["status"] == "interrupted" and summary["restarts"] == [0, 1]
    assert sum(saved["steps"]) == summary["env_steps"] > 0
    assert not ray_processes("ChildActor")  # gone when the driver exits, not later


def test_a_crash_reports_the_remote_traceback_role_rank_and_node(cluster, tmp_path):
    done = run_ray(cluster, "--plugin", "relay", "--workers", "2", *WORKER,
                   "--set", "fault=raise", "--set", "fault_rank=1",
                   "--run-dir", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "worker 1" in done.stderr and "RuntimeError: injected failure in worker:1" in done.stderr
    node = placed(read_metrics(tmp_path / "run"))["worker 1"]["node"]
    assert f"on node {node}" in done.stderr


def test_a_hung_actor_is_killed_and_reported(cluster, tmp_path):
    done = run_ray(cluster, "--plugin", "relay", "--workers", "2", *WORKER,
                   "--set", "fault=hang", "--worker-timeout", "15",  # (the train process of a
                   # loaded machine answers the driver's poll within that; at 8 s it once did not,
                   # in a full suite, and was reported hung alone)
                   "--run-dir", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "worker 0" in done.stderr and "hung: no heartbeat for" in done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # worker 0 is the hung one (in the suite the train process, blocked on the queue worker 0
    # stopped filling, was once reported in the same tick: listed first, as the table is)
    hung = [f["rank"] for f in summary["failures"] if f["reason"].startswith("hung")]
    assert 0 in hung, summary["failures"]


def test_with_no_address_the_run_starts_ray_for_itself_and_stops_it(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # Ray's own default: it says so
    run_dir = tmp_path / "run"
    sessions = Path(os.environ["RAY_TMPDIR"]) / "ray"
    before = set(sessions.glob("session_2*"))
    timeline = tmp_path / "timeline.jsonl"
    done = cli("run", "--plugin", "impala", "--backend", "ray", "--workers", "1",
               "--total-steps", "3000", "--run-dir", str(run_dir), timeout=300,
               env={**os.environ, "MPRL_TIMELINE": str(timeline)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(sessions.glob("session_2*")) == before  # its Ray's logs went with it
    # one Ray, started by the command's first act, while it imported torch, and taken by the run
    assert _ray_starts(timeline) == ["mprl-ray-start"]
    # Ray's note on turning token authentication on, news about a cluster nobody else sees
    assert "Token authentication is enabled" not in done.stderr, done.stderr
    # its Ray (gcs_server, raylet, workers) was started by the run: the leftover check finds
    # any of them by the test's mark in their environment


def _ray_starts(timeline: Path) -> list[str]:
    """The threads that started a Ray, in order, from a run's timeline."""
    marks = [json.loads(line) for line in timeline.read_text().splitlines()]
    return [m["thread"] for m in marks if m["mark"] == "ray-started"]


def test_a_run_that_needs_more_cpus_than_its_command_line_said_starts_its_ray_again(
    tmp_path, monkeypatch
):
    """The command line asks for one worker, the config file for three: the Ray started ahead
    with the command line's CPUs is stopped, and the run starts one that holds it."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sessions = Path(os.environ["RAY_TMPDIR"]) / "ray"
    before = set(sessions.glob("session_2*"))
    config, timeline = tmp_path / "three.toml", tmp_path / "timeline.jsonl"
    config.write_text("[run]\nworkers = 3\n")
    done = cli("run", "--plugin", "impala", "--backend", "ray", "--config", str(config),
               "--total-steps", "2000", "--run-dir", str(tmp_path / "run"), "--quiet",
               timeout=300, env={**os.environ, "MPRL_TIMELINE": str(timeline)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _ray_starts(timeline) == ["mprl-ray-start", "MainThread"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["per_worker_steps"]) == 3 and summary["env_steps"] >= 2000
    assert set(sessions.glob("session_2*")) == before  # both Rays' logs went


#: ``python -m mprl ARGS`` whose first Ray start on this machine fails as Ray's own does when its
#: raylet is slow to register (a loaded machine): once its processes have started
FAILING_FIRST_START = """
import runpy, sys
import ray._private.node as node
real, failed = node.Node.start_ray_processes, []

def once(self):
    real(self)
    if not failed:
        failed.append(True)
        raise Exception("The current node timed out during startup (mprl-test)")

node.Node.start_ray_processes = once
sys.argv = ["mprl", *sys.argv[1:]]
runpy.run_module("mprl", run_name="__main__", alter_sys=True)
"""


def test_a_ray_start_ahead_that_fails_leaves_no_process_or_logs_and_the_run_starts_ray_again(
    tmp_path, monkeypatch
):
    """Ray's start ahead of the run fails after it has started processes (what Ray raises when
    its raylet is slow to register): the run starts Ray again and finishes, and nothing of the
    failed start stays (its session directory, the runtime-env agent its raylet started)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sessions = Path(os.environ["RAY_TMPDIR"]) / "ray"
    before = set(sessions.glob("session_2*"))
    timeline = tmp_path / "timeline.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", FAILING_FIRST_START, "run", "--plugin", "impala", "--backend",
         "ray", "--workers", "1", "--total-steps", "2000", "--run-dir", str(tmp_path / "run"),
         "--quiet"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "MPRL_TIMELINE": str(timeline)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "mprl-test" not in done.stderr, done.stderr  # a start that was retried is not said
    marks = [json.loads(line)["mark"] for line in timeline.read_text().splitlines()]
    assert marks.count("ray-starting") == 1  # the start ahead, which failed
    assert _ray_starts(timeline) == ["MainThread"]  # and the run's own
    assert set(sessions.glob("session_2*")) == before  # neither one's logs stayed
    # the processes of both: the leftover check finds any of them by the test's mark


@pytest.mark.parametrize("refused", ["unknown plugin", "run directory in use"])
def test_a_ray_started_ahead_for_a_command_refused_before_its_run_stops_as_it_exits(
    tmp_path, monkeypatch, refused
):
    """Refused before the backend took the Ray started ahead (an unknown plugin), or after
    (a run directory with another run's files): Ray stops and its logs go, nothing ran."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sessions = Path(os.environ["RAY_TMPDIR"]) / "ray"
    before = set(sessions.glob("session_2*"))
    timeline, used = tmp_path / "timeline.jsonl", tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("another run's")
    plugin = "nosuch" if refused == "unknown plugin" else "impala"
    done = cli("run", "--plugin", plugin, "--backend", "ray", "--workers", "1",
               "--run-dir", str(used), env={**os.environ, "MPRL_TIMELINE": str(timeline)})  # fmt: skip
    said = "unknown plugin/algorithm 'nosuch'" if plugin == "nosuch" else "already exists"
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert done.stderr.startswith("mprl: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert _ray_starts(timeline) == ["mprl-ray-start"]  # it had started (or finished starting)
    assert set(sessions.glob("session_2*")) == before
    assert sorted(p.name for p in used.iterdir()) == ["notes.txt"]
    # its Ray's processes: the leftover check finds any of them by the test's mark


def _default_terminal_signals() -> None:
    """A Ctrl-C and a hang-up at their defaults in the command, however the suite was started
    (``nohup``, a background job of a script: ignored there, and so in what it starts)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


#: the moments of a Ctrl-C while Ray starts ahead of the run, by the command's timeline: its
#: Ray starting in a thread while it imports Ray, torch and the CLI; its Ray started (the
#: imports may or may not be done); the imports done, its Ray perhaps still starting
EARLY_MOMENTS = ["ray-starting", "ray-started", "main"]


@pytest.mark.parametrize("moment", EARLY_MOMENTS)
def test_ctrl_c_while_ray_starts_ahead_of_the_run_stops_it_and_leaves_nothing(
    tmp_path, monkeypatch, moment
):
    """A Ctrl-C to the command's group at each moment of its start, Ray starting ahead of the
    run: the command ends as interrupted (130, no traceback, the last line says so); Ray's
    processes, which keep the terminal's signals blocked, are stopped by it and its logs go."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sessions = Path(os.environ["RAY_TMPDIR"]) / "ray"
    before = set(sessions.glob("session_2*"))
    timeline = tmp_path / "timeline.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", "--plugin", "impala", "--backend", "ray",
         "--workers", "1", "--run-dir", str(tmp_path / "run"), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_default_terminal_signals, env={**os.environ, "MPRL_TIMELINE": str(timeline)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
            timeline.exists() and f'"mark": "{moment}"' in timeline.read_text()
        ):
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    # the last line: the command's, stopped before its run began, or the run's summary (a
    # Ray that was quick to start: the run had begun)
    # (after it, a line of the exit may say that it did not wait for a Ray start that an
    # import lock the Ctrl-C left held keeps from ending: seen under load, about 1 in 5)
    said = [line for line in stderr.splitlines() if "Ray's start on this machine" not in line]
    last = (said or stdout.splitlines())[-1]
    assert last == "mprl: interrupted" or last.startswith("mprl: interrupted (SIGINT)"), last
    assert "Failed to connect to GCS" not in stderr, stderr
    marks = [
        (m["mark"], m.get("thread")) for m in map(json.loads, timeline.read_text().splitlines())
    ]
    assert set(sessions.glob("session_2*")) == before, (marks, stderr)
    # Ray's processes and /dev/shm: the leftover check finds any of them by the test's mark


#: a driver whose transport hub answers only after a minute, as an actor placed on a node too
#: busy to start it would: every call to it is answered by a Ray task that sleeps first
SLOW_HUB = """
import sys, time, ray
from mprl.transport import client
from mprl_builtin.ray import link
client.START_TIMEOUT_S = float(sys.argv[1])

@ray.remote(num_cpus=0)
def later():
    time.sleep(60)

def call(self, method, *args):
    print("mprl-test: the hub is called", file=sys.stderr, flush=True)
    return later.remote()

link.RayLink.call = call  # (the driver's calls: the actors' own are not patched)
from mprl.tools.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("how", ["timeout", "ctrl-c"])
def test_a_hub_that_does_not_answer_as_the_run_starts_ends_it_in_words(cluster, tmp_path, how):
    """The train process's actor still not answering when the backend's start-up time is up:
    the run fails naming it (exit 1, no traceback); a Ctrl-C meanwhile ends the wait and the
    run as interrupted (130). Nothing of it is left (the leftover check)."""
    run_dir = tmp_path / "run"
    args = ["run", "--backend", "ray", "--ray-address", cluster.address, "--plugin", "impala",
            "--workers", "1", "--total-steps", "2000", "--checkpoint-every", "1",
            "--run-dir", str(run_dir)]  # fmt: skip
    timeout = "3" if how == "timeout" else "180"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_HUB, timeout, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        if how == "ctrl-c":
            said = []
            while not said or "the hub is called" not in said[-1]:
                said.append(proc.stderr.readline())
                assert said[-1], said  # (ended before it called the hub)
            time.sleep(2)  # two checkpoint periods of a run still starting
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    # nothing ran: no checkpoint of a state never built (--checkpoint-every is for a run going on)
    assert not (run_dir / "checkpoints" / "last.pt").exists()
    if how == "timeout":
        assert proc.returncode == 1, stderr
        assert "trainer did not start within 3 s" in stderr, stderr
        assert summary["status"] == "failed"
        assert "did not start within 3 s" in summary["failures"][0]["reason"]
    else:
        assert proc.returncode == 130, stderr
        assert time.monotonic() - sent < 30  # the wait's slice, then the stop; not 180 s
        assert summary["status"] == "interrupted" and summary["env_steps"] == 0


@pytest.mark.parametrize("when", ["at once", "once stepping"])
def test_sigterm_and_sigint_to_a_ray_driver_stop_it_cleanly(cluster, tmp_path, when):
    """Ray's init sets its own signal handlers; mprl's are put in after it joins, so a SIGTERM
    is a clean stop with a summary (143) and a SIGINT in the first seconds leaves no
    traceback (130)."""
    run_dir = tmp_path / "run"
    args = ["--backend", "ray", "--ray-address", cluster.address, "--plugin", "relay",
            "--workers", "2", *WORKER, "--total-steps", "400000",
            "--set", "step_sleep=0.001", "--run-dir", str(run_dir)]  # fmt: skip
    sig = signal.SIGTERM if when == "once stepping" else signal.SIGINT
    with running(args) as proc:
        if when == "at once":  # the run directory is made once Ray is joined
            deadline = time.monotonic() + 120
            while not (run_dir / "config.json").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            wait_for_metrics(run_dir, lambda r: "episode_return" in r, timeout=120)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr and "TypeError" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == sig


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["sigint", "sighup"])
def test_the_terminals_signals_to_the_whole_group_of_an_embedded_ray_run_stop_it_cleanly(
    cluster, tmp_path, monkeypatch, sig
):
    """Ctrl-C, or a closed terminal, reaches the driver and the Ray it started (one process
    group): Ray's processes keep them blocked, so the driver stops the run cleanly."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", "--plugin", "impala", "--backend", "ray",
         "--workers", "1", "--total-steps", "10000000", "--run-dir", str(run_dir), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_metrics(run_dir, lambda r: "episode_return" in r, timeout=180)
        os.killpg(proc.pid, sig)
        _, stderr = proc.communicate(timeout=90)
    finally:
        end(proc)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr and "Failed to connect to GCS" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["env_steps"] > 0
