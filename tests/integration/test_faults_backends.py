"""Faults at the backends' edges: what a plugin leaves running, a silent Manager
server. Each case is a real run through the CLI."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from mprl.backends.processes import MANAGER_STOPPED_S, ManagerServer
from tests.conftest import (
    alive,
    cli,
    read_metrics,
    running,
    stepped,
    wait_for_children,
    wait_for_metrics,
    wait_until,
)


def _state(pid: int) -> str:
    """``pid``'s state letter in /proc (``R``, ``S``, ``T``, ``Z``; ``""`` when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("Z", "")


def test_what_a_worker_starts_and_leaves_running_ends_with_the_run(installed, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "probe", "--workers", "1", "--quiet", "--run-dir", str(run_dir),
        "--total-steps", "200", "--set", "fault=orphans", "--set", "fault_at_step=5",
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (record,) = [r for r in read_metrics(run_dir) if "orphan_fork" in r]
    pids = [int(record["orphan_subprocess"]), int(record["orphan_fork"])]
    deadline = time.monotonic() + 10  # SIGKILL is delivered at once; reaping by init may lag
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "a plugin's processes outlived the run"


PROBE_FOREVER = ["--plugin", "probe", "--workers", "2", "--set", "step_sleep=0.01", "--quiet"]


@pytest.mark.parametrize("then", ["wait", "sigint", "sigterm"])
def test_a_stopped_manager_server_fails_the_run_naming_it(installed, tmp_path, then):
    """A SIGSTOPped Manager server answers no read (the main process's included): it is killed
    after MANAGER_STOPPED_S and the run fails naming it, whatever the user does meanwhile."""
    run_dir = tmp_path / "run"
    with running([*PROBE_FOREVER, "--run-dir", str(run_dir)]) as proc:
        wait_for_metrics(run_dir, stepped)
        names = wait_for_children(proc, {"mprl-manager", "mprl-worker-0", "mprl-trainer"})
        (server,) = [k for k, name in names.items() if name == "mprl-manager"]
        os.kill(server, signal.SIGSTOP)
        if then != "wait":
            proc.send_signal(signal.SIGINT if then == "sigint" else signal.SIGTERM)
        _, stderr = proc.communicate(timeout=90)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "Manager server stopped (SIGSTOP) and silent for 5 s; killed" in stderr, (
        summary,
        stderr,
    )
    assert "Traceback" not in stderr.split("--- traceback of")[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    if then == "wait":
        assert proc.returncode == 1 and summary["status"] == "failed"
    else:  # stopped by the user: interrupted, and the Manager's end still reported
        assert proc.returncode in (1, 130, 143) and summary["status"] in ("failed", "interrupted")
    assert not alive(server)


@pytest.mark.parametrize("then", ["stays stopped", "goes on"])
def test_the_stops_last_look_at_a_stopped_manager_server_waits_for_its_verdict(then):
    """At the stop, a server the watch has not yet judged (a loaded machine delays it) is waited
    on: killed and named if it stays stopped, no failure if it goes on. Without the wait, the
    stop saw it alive, the final checkpoint then failed on it, and the loss went unreported."""
    server = ManagerServer()
    try:
        os.kill(server.process.pid, signal.SIGSTOP)
        # the stop shows in /proc once the server is scheduled (later on a loaded machine)
        wait_until(lambda: _state(server.process.pid) == "T", "the server stopped")
        assert server.failure() is None  # the watch has not counted its 5 s yet
        if then == "goes on":
            threading.Timer(1.0, os.kill, (server.process.pid, signal.SIGCONT)).start()
        start = time.monotonic()
        lost = server.failure(settle=True)
        waited = time.monotonic() - start
        if then == "stays stopped":
            assert lost is not None and lost.who == "Manager server", lost
            assert f"stopped (SIGSTOP) and silent for {MANAGER_STOPPED_S:g} s; killed" in (
                lost.reason
            )
            assert not alive(server.process.pid)
        else:
            assert lost is None and waited < MANAGER_STOPPED_S, (lost, waited)
            assert server.manager.dict().copy() == {}  # it answers again
    finally:
        if alive(server.process.pid):
            os.kill(server.process.pid, signal.SIGCONT)
        server.shutdown()
