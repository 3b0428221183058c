"""Faults of the local backend's process tree, through the CLI: the forkserver stopped or killed
(while the run starts its children, and while they run), Ctrl-Z (SIGTSTP) to the main process,
and processes a child starts that leave its process group (a new session, a double fork). Each
ends in one line, a run that goes on or stops cleanly, and nothing left behind (the autouse
leftover check)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.conftest import (
    child_pids,
    clean_stderr,
    comm,
    read_metrics,
    running,
    stepped,
    wait_for_metrics,
    wait_until,
)


def probe(run_dir: Path, *settings: str, steps: int = 10**9, workers: int = 2) -> list[str]:
    args = ["--plugin", "probe", "--workers", str(workers), "--quiet", "--run-dir", str(run_dir)]
    args += ["--total-steps", str(steps), "--set", "step_sleep=0.002"]
    for setting in settings:
        args += [setting] if setting.startswith("--") else ["--set", setting]
    return args


def forkserver_of(pid: int) -> int:
    """The forkserver of the run whose main process is ``pid``."""

    def found() -> int | None:
        for child in child_pids(pid):
            # forked from the main process (named), or a new interpreter (its command line)
            if comm(child) == "mprl-forkserver" or b"forkserver import main" in _cmd(child):
                return child
        return None

    return wait_until(found, "the run's forkserver")


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def said(run_dir: Path, words: str) -> list[dict]:
    return [r for r in read_metrics(run_dir) if words in r.get("message", "")]


def test_a_stopped_forkserver_is_killed_and_named_and_the_run_goes_on_and_stops(installed, run_dir):
    """SIGSTOP to the forkserver while the children run: it is killed after 5 s, named, and
    the run goes on; then a Ctrl-C stops it cleanly (the children's exits read here, not
    through the stopped server: no wait on it for ever)."""
    with running(probe(run_dir)) as proc:
        wait_for_metrics(run_dir, stepped)
        server = forkserver_of(proc.pid)
        os.kill(server, signal.SIGSTOP)
        wait_until(lambda: said(run_dir, f"the forkserver (pid {server}) was stopped"), "killed")
        before = sum(r["step"] for r in read_metrics(run_dir)[-1:])
        wait_until(lambda: read_metrics(run_dir)[-1]["step"] > before, "steps after the kill")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    clean_stderr(stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and not summary["failures"]
    assert summary["shutdown_s"] < 5


def test_a_forkserver_stopped_before_the_children_start_never_hangs_the_run(installed, run_dir):
    """SIGSTOP to the forkserver as soon as it exists (the run starts its children next: a
    start waits on it): the stopped server is killed after 5 s and a new one starts them; a
    Ctrl-C that comes meanwhile is not ignored."""
    with running(probe(run_dir, steps=600)) as proc:
        server = forkserver_of(proc.pid)
        os.kill(server, signal.SIGSTOP)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert f"mprl: the forkserver (pid {server}) was stopped (SIGSTOP); killed" in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] >= 600
    second = run_dir.with_name("second")
    with running(probe(second)) as proc:
        server = forkserver_of(proc.pid)
        os.kill(server, signal.SIGSTOP)
        # the run has its signal handlers in once it writes its metrics; its first child's
        # start waits on the stopped server then
        wait_until(lambda: (second / "metrics.jsonl").exists(), "the run under way")
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    assert proc.returncode == 130, stderr
    assert took < 10, took  # not blocked until the server is continued


def test_a_killed_forkserver_is_named_its_children_go_on_and_a_restart_gets_a_new_one(
    installed, run_dir
):
    """The forkserver killed mid-run: said once, its children are not taken for crashed (their
    exits are read here, as the run's subreaper), and a worker that then dies is restarted from
    a new forkserver."""
    args = probe(run_dir, "--max-restarts=1", "--max-time=40")
    with running(args) as proc:
        wait_for_metrics(run_dir, stepped)
        server = forkserver_of(proc.pid)
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: said(run_dir, f"the forkserver (pid {server}) ended"), "said")
        children = {comm(p): p for p in child_pids(proc.pid)}
        assert {"mprl-worker-0", "mprl-worker-1"} <= set(children)  # now the main process's
        os.kill(children["mprl-worker-0"], signal.SIGKILL)
        wait_until(lambda: said(run_dir, "restarting it"), "the restart")
        wait_until(lambda: forkserver_of(proc.pid) != server, "a new forkserver")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "exited with code 255" not in stderr and "Manager server" not in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["restarts"] == [1, 0]


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_ctrl_z_stops_the_children_with_the_job_and_fg_goes_on(installed, run_dir):
    """SIGTSTP to the main process (Ctrl-Z in a shell): the workers and the train process (in
    process groups of their own) stop with it, and go on with it on SIGCONT (fg); the time it
    was stopped is no hang (--worker-timeout 2 and 4 s stopped)."""
    with running(probe(run_dir, "--worker-timeout=2")) as proc:
        wait_for_metrics(run_dir, stepped)
        kids = [p for p in child_pids(proc.pid) if comm(p).startswith("mprl-")]
        kids = [p for p in kids if comm(p) != "mprl-forkserver"]  # (in the job's own group)
        assert {"mprl-worker-0", "mprl-worker-1"} <= {comm(k) for k in kids}
        proc.send_signal(signal.SIGTSTP)
        wait_until(lambda: state(proc.pid) == "T", "the main process stopped")
        wait_until(lambda: all(state(k) in ("T", "t") for k in kids), "the children stopped")
        time.sleep(4)
        steps = read_metrics(run_dir)[-1]["step"]
        proc.send_signal(signal.SIGCONT)
        wait_until(lambda: read_metrics(run_dir)[-1]["step"] > steps, "steps after fg")
        assert all(state(k) not in ("T", "t") for k in kids)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "hung" not in stderr
    assert not json.loads((run_dir / "summary.json").read_text())["failures"]


def test_processes_a_child_left_in_a_new_session_end_with_the_run_and_are_said(installed, run_dir):
    """A worker starts a process in a new session and a daemon by a double fork, and never ends
    them: the run ends them and says so; none is left (the leftover check finds what carries
    the test's mark)."""
    args = probe(run_dir, "fault=daemons", "fault_at_step=5", "fault_rank=0", steps=300)
    with running(args) as proc:
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    logged = next(r for r in read_metrics(run_dir) if "daemon_session" in r)
    for pid in (logged["daemon_session"], logged["daemon_forked"]):
        assert f"a process the run's children left running (pid {pid}:" in stderr
        assert state(pid) is None
