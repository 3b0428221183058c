"""Faults over a run's life, through the CLI: a run directory another run holds, a stale lock,
eval's output checked first, a plugin's act that breaks its contract, signals while the Manager
server starts, while the main process imports and between worker starts, a checkpoint that
would import code, a killed main process, file modes, a stop that a child's failure follows."""

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

from tests.conftest import (
    child_pids,
    clean_stderr,
    cli,
    cli_here,
    comm,
    end,
    read_metrics,
    running,
    wait_for_children,
    wait_for_metrics,
    wait_until,
)
from tests.unit.test_machine_limits import probe


# two processes cannot write one run directory
def test_a_run_directory_in_use_is_refused_naming_the_pid_that_holds_it(installed, run_dir):
    # (a run with no end: it holds the directory until the test stops it)
    with running([*probe(run_dir, steps=10**9), "--checkpoint-every", "0.5"]) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("event") == "checkpoint")
        config = (run_dir / "config.json").read_bytes()
        tmp = run_dir / "checkpoints" / ".last.pt.in-flight.tmp"  # as a write in progress
        tmp.write_bytes(b"x")
        again = cli("run", "--resume", str(run_dir), "--quiet")
        assert again.returncode == 2, again.stderr
        assert f"is in use by another mprl process (pid {proc.pid})" in again.stderr
        assert (run_dir / "config.json").read_bytes() == config and tmp.exists()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    records = read_metrics(run_dir)
    assert not [r for r in records if r.get("event") == "resume"]  # one session wrote here
    # the lock ends with its process: a resume now takes the directory over
    tmp.unlink()
    resumed = cli("run", "--resume", str(run_dir), "--total-steps", "1", "--quiet")
    assert resumed.returncode == 0, resumed.stderr


def test_a_stale_lock_of_a_killed_run_is_taken_over(installed, run_dir):
    with running([*probe(run_dir, steps=10**9), "--checkpoint-every", "0.5"]) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("event") == "checkpoint")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (run_dir / ".lock").read_text().strip() == str(proc.pid)  # left by the dead run
    resumed = cli("run", "--resume", str(run_dir), "--total-steps", "1", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert (run_dir / ".lock").read_text().strip() != str(proc.pid)


# eval --out cannot overwrite the checkpoint it reads, nor go nowhere
def test_eval_out_is_checked_before_anything_is_played(installed, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert (
        cli("run", *probe(run_dir, steps=200, workers=1), "--set", "play_action=0").returncode == 0
    )
    ckpt = run_dir / "checkpoints" / "last.pt"
    before = ckpt.read_bytes()
    cases = [
        (str(ckpt), "is the checkpoint being evaluated"),
        (str(tmp_path), "is a directory"),
        (str(tmp_path / "missing" / "e.json"), "does not exist"),
    ]
    for out, message in cases:
        code, err = cli_here(capsys, "eval", str(run_dir), "--out", out)
        assert code == 2 and message in err and "Traceback" not in err, err
    assert ckpt.read_bytes() == before
    code, _ = cli_here(capsys, "eval", str(run_dir), "--out", str(tmp_path / "e.json"))
    assert code == 0 and json.loads((tmp_path / "e.json").read_text())["episodes"] == 10


# a plugin's act() that breaks its contract costs the run nothing
@pytest.mark.parametrize("returns", ["tensor", "raise"])
def test_a_broken_act_is_reported_once_and_the_run_goes_on(installed, tmp_path, returns):
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "probe", "--env", "Ledge-v0", "--workers", "1", "--quiet",
        "--set", "train_action=0", "--set", "play_action=0", "--set", f"act_returns={returns}",
        "--set", "step_sleep=0.001", "--total-steps", "5000", "--run-dir", str(run_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] and summary["stop_reason"] == "solved"  # the training returns
    assert (run_dir / "checkpoints" / "last.pt").exists()
    checks = [r for r in read_metrics(run_dir) if r.get("event") == "policy-check"]
    assert len(checks) == 1 and "error" in checks[0]
    expected = (
        "TypeError: act(obs_batch, deterministic) returned Tensor"
        if returns == "tensor"
        else "ValueError: act() is broken"
    )
    assert expected in checks[0]["error"]
    assert proc.stderr.count("the policy check could not play algorithm 'probe'") == 1
    clean_stderr(proc.stderr)


# SIGTERM to the whole process group while the Manager server starts
def test_sigterm_to_the_group_while_the_manager_starts_is_a_clean_stop(installed, run_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", *probe(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:

        def manager() -> bool:  # named so in its first act, before it answers
            return any(comm(p) == "mprl-manager" for p in child_pids(proc.pid))

        deadline = time.monotonic() + 60
        while not manager() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert manager(), "no Manager server started"
        os.killpg(proc.pid, signal.SIGTERM)  # what systemd and Slurm do
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "EOFError" not in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signal.SIGTERM


#: ``python -m mprl ARGS`` that sends itself a Ctrl-C the moment its run directory has its
#: ``config.json``, before anything of the run starts
CTRL_C_ONCE_CONFIGURED = """
import os, signal, sys
from mprl.host import runner
write = runner._write_config

def then_ctrl_c(rundir, plan):
    write(rundir, plan)
    os.kill(os.getpid(), signal.SIGINT)

runner._write_config = then_ctrl_c
from mprl.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


# a Ctrl-C just as the run directory is made (a test's signal once config.json is there came
# before the run's handlers under load): a run directory always gets its summary
def test_a_ctrl_c_as_the_run_directory_is_made_stops_the_run_there_with_a_summary(
    installed, run_dir
):
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_ONCE_CONFIGURED, "run", *probe(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signal.SIGINT
    assert summary["env_steps"] == 0  # it stopped before its first child started
    assert not any(r.get("source", "").startswith("worker") for r in read_metrics(run_dir))


# SIGTERM / SIGHUP to the group while the main process still imports, its children's
# forkserver already started (python -m mprl run's first act)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_main_process_imports_ends_it_with_nothing_left(
    installed, tmp_path, sig
):
    timeline = tmp_path / "timeline.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", *probe(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "MPRL_TIMELINE": str(timeline)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the server's mark is written whole
            if timeline.exists() and timeline.read_text().endswith("\n"):
                break
            time.sleep(0.001)
        os.killpg(proc.pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    marks = [json.loads(line)["mark"] for line in timeline.read_text().splitlines()]
    assert marks == ["forkserver"]  # it ended before the CLI had imported what it needs
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "run").exists()
    # the fixture: no process (the server leaves once the main process has), no temp dir


# a stop request while the workers start one after another
def test_a_stop_between_worker_starts_starts_no_more_workers(installed, run_dir):
    args = [*probe(run_dir, workers=4), "--start-interval", "10"]
    with running(args) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("source") == "worker:0")
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - started
    assert proc.returncode == 130, stderr
    assert took < 10, took  # not after the next start (10 s on), let alone the other three
    sources = {r.get("source") for r in read_metrics(run_dir)}
    assert "worker:0" in sources and not sources & {"worker:1", "worker:2", "worker:3"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["per_worker_steps"][1:] == [0, 0, 0]


# an env id read from a checkpoint does not get to import code; nor does pickled code
def test_a_checkpoint_cannot_make_mprl_import_a_module(installed, tmp_path):
    run_dir = tmp_path / "run"
    assert cli("run", *probe(run_dir, steps=200, workers=1)).returncode == 0
    ckpt = run_dir / "checkpoints" / "last.pt"
    data = torch.load(ckpt, weights_only=True)
    data["run"]["env"] = "evilmod:Corridor-v0"
    torch.save(data, ckpt)
    marker = tmp_path / "evil-ran"
    (tmp_path / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    for args in (["eval", str(run_dir)], ["run", "--resume", str(run_dir), "--quiet"]):
        proc = cli(*args, cwd=tmp_path)  # `python -m mprl` puts the cwd on sys.path
        assert proc.returncode == 2, proc.stderr
        assert "imports the Python module 'evilmod'" in proc.stderr
        assert "--env evilmod:Corridor-v0" in proc.stderr and not marker.exists()
    trusted = cli("eval", str(run_dir), "--env", "evilmod:Corridor-v0", cwd=tmp_path)
    assert marker.exists(), trusted.stderr  # the user said so: it is imported
    torch.save({"format": "mprl-checkpoint", "code": Path("x")}, ckpt)  # pickled code
    proc = cli("eval", str(run_dir))
    assert proc.returncode == 2 and "holds Python objects (code)" in proc.stderr
    assert "weights_only" not in proc.stderr  # never the advice that would run it


# the main process SIGKILLed leaves nothing behind (the fixture checks /tmp/pymp-*,
# /dev/shm and processes after every test)
def test_a_killed_main_process_leaves_no_stack_files_or_cut_writes(installed, run_dir):
    with running(probe(run_dir, "fault=none", steps=10**9)) as proc:
        wait_for_metrics(run_dir, lambda r: "episode_return" in r)
        wait_for_children(proc, {"mprl-worker-0", "mprl-worker-1", "mprl-trainer"})
        kids = child_pids(proc.pid)
        # a stack file per child once it is up: trainer, two workers
        wait_until(lambda: len(list((run_dir / "logs").glob("*.stack"))) == 3, "3 stack files")
        cut = run_dir / "checkpoints" / ".last.pt.cut.tmp"  # a write the kill cut short
        cut.write_bytes(b"half")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{k}").exists() for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (run_dir / "logs").exists() and not cut.exists()


# one rule for file modes: the user's umask, as open() applies it
def test_every_file_of_a_run_has_the_mode_the_umask_gives(installed, run_dir):
    assert cli("run", *probe(run_dir, steps=200, workers=1)).returncode == 0
    mask = os.umask(0o022)
    os.umask(mask)
    files = [p for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"]
    assert {p.name for p in files} >= {"config.json", "summary.json", "metrics.jsonl", "last.pt"}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {oct(0o666 & ~mask)}


def test_a_run_stopped_by_the_user_is_interrupted_even_when_a_child_fails_after(installed, run_dir):
    with running(probe(run_dir, "fault=raise_at_stop", "fault_rank=1", steps=10**9)) as proc:
        # worker 1 (the one that fails once stopped) is up and stepping
        wait_for_metrics(run_dir, lambda r: r.get("source") == "worker:1" and "episode_return" in r)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["failures"][0]["rank"] == 1
    assert "RuntimeError: injected failure in worker:1" in stderr  # still reported
