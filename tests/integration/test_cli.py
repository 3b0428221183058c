"""The CLI as a user runs it: a subprocess, exit codes, messages, the run directory."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import mprl
from tests.conftest import (
    alive,
    child_pids,
    cli,
    end,
    own_group,
    read_metrics,
    running,
    stepped,
    wait_for_children,
    wait_for_metrics,
)


def test_bad_input_through_a_real_process(installed, tmp_path):
    proc = cli("run", "--plugin", "a3c", "--set", "lr=-1", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "mprl: error: a3c config: field 'lr': 'lr' must be > 0.0: -1.0"
    ]


def test_an_env_whose_constructor_takes_no_render_mode_runs(installed, tmp_path):
    # case 11: older envs; the built-in factory passes render_mode only when one is set
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", "ppo", "--env", "OldStyle-v0", "--workers", "1",
               "--total-steps", "500", "--quiet", "--run-dir", str(run_dir))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] >= 500


def test_bad_toml_config_names_the_file_and_field(installed, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = [\n")
    proc = cli("run", "--plugin", "a3c", "--config", str(bad))
    assert proc.returncode == 2 and f"config file '{bad}' is not valid TOML" in proc.stderr
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("lr = 0.01\n[run]\nworkerz = 2\n")
    proc = cli("run", "--plugin", "a3c", "--config", str(unknown))
    assert proc.returncode == 2
    assert f"config file '{unknown}' [run]: unknown field 'workerz'" in proc.stderr


def test_toml_and_set_reach_the_resolved_config(installed, tmp_path):
    cfg = tmp_path / "cfg.toml"
    cfg.write_text("lr = 0.01\nn_steps = 4\n[run]\nworkers = 1\nseed = 7\n")
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "a3c", "--config", str(cfg), "--set", "n_steps=6",
        "--total-steps", "2e3", "--run-dir", str(run_dir), "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    resolved = json.loads((run_dir / "config.json").read_text())
    assert resolved["config"]["lr"] == 0.01 and resolved["config"]["n_steps"] == 6  # --set wins
    assert resolved["run"]["workers"] == 1 and resolved["run"]["seed"] == 7
    assert resolved["run"]["total_steps"] == 2000
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 2000 and summary["status"] == "finished"
    assert "mprl: finished" in proc.stdout and str(run_dir) in proc.stdout


def test_plugins_lists_distribution_algorithms_hooks_and_failures(installed):
    proc = cli("plugins")
    assert proc.returncode == 0
    assert f"a3c  (mprl {mprl.__version__})" in proc.stdout
    assert "testplugin  (mprl-testplugin 0.1.0)" in proc.stdout
    assert "FAILED plugin 'broken'" in proc.stdout
    data = json.loads(cli("plugins", "--json").stdout)
    by_name = {p["name"]: p for p in data["plugins"]}
    assert by_name["a3c"]["algorithms"] == ["a3c"]
    assert by_name["testplugin"]["hooks"] == [
        "mprl_make_env",
        "mprl_register_algorithms",
        "mprl_register_options",
    ]
    assert data["failed"][0]["distribution"] == "mprl-brokenplugin"


def test_run_help_with_plugin_lists_its_config_fields():
    proc = cli("run", "--plugin", "a3c", "--help")
    assert proc.returncode == 0
    assert "--total-steps" in proc.stdout
    assert "lr (float)" in proc.stdout and "default 0.001" in proc.stdout
    assert "Adam learning rate" in proc.stdout


A3C_FOREVER = [
    "--plugin",
    "a3c",
    "--workers",
    "2",
    "--total-steps",
    "100000000",
    "--set",
    "lr=1e-6",
]
PROBE_FOREVER = ["--plugin", "probe", "--workers", "2", "--set", "step_sleep=0.01", "--quiet"]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_cleanly_with_checkpoint_and_exit_code(tmp_path, sig, code):
    run_dir = tmp_path / "run"
    with running([*A3C_FOREVER, "--run-dir", str(run_dir)]) as proc:
        # the checkpoint must hold steps: wait until the run has taken some, and both workers
        # are up, however slowly a busy machine starts them
        wait_for_metrics(run_dir, stepped)
        wait_for_children(proc, {"mprl-worker-0", "mprl-worker-1"})
        kids = child_pids(proc.pid)
        assert len(kids) >= 3  # two workers and multiprocessing's resource tracker
        start = time.monotonic()
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - start
    assert proc.returncode == code, stderr
    assert took < 10
    assert "KeyboardInterrupt" not in stderr and "Traceback" not in stderr
    assert "leaked" not in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["stop_reason"] == sig.name
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["env_steps"] == summary["env_steps"] > 0
    deadline = time.monotonic() + 5
    while [k for k in kids if alive(k)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in kids if alive(k)], "children outlived the run"


def test_sigterm_to_the_whole_process_group_is_a_clean_stop(installed, tmp_path):
    run_dir = tmp_path / "run"
    with running(["--plugin", "probe", "--workers", "2", "--set", "step_sleep=0.01", "--quiet",
                  "--run-dir", str(run_dir)]) as proc:  # fmt: skip
        wait_for_metrics(run_dir)
        for pid in [proc.pid, *child_pids(proc.pid)]:  # what `kill -TERM -PGID` would do
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert "shared state not saved" not in stderr  # the Manager server waits for the main
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"


def _ledge_run(run_dir, play_action: int) -> tuple[dict, list[dict], str]:
    """probe on Ledge-v0: its workers always walk to the end of the ledge (return 10, the
    threshold); its model's act() plays ``play_action`` (1: steps off, return 0)."""
    proc = cli("run", "--plugin", "probe", "--env", "Ledge-v0", "--workers", "1",
               "--set", "train_action=0", "--set", f"play_action={play_action}",
               "--set", "step_sleep=0.001", "--total-steps", "2000",
               "--run-dir", str(run_dir), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary, read_metrics(run_dir), proc.stdout + proc.stderr


def test_a_run_is_solved_only_once_its_policy_plays_at_the_threshold_too(installed, tmp_path):
    summary, records, output = _ledge_run(tmp_path / "falls", play_action=1)
    assert not summary["solved"] and summary["stop_reason"] == "total steps reached"
    checks = [r for r in records if r.get("event") == "policy-check"]
    assert checks and all(c["mean_return"] == 0.0 for c in checks)
    assert "the policy now plays 0.0 over 10 episodes; training goes on" in output
    counts = [c["episodes"] for c in checks]  # one check per 20 training episodes at most
    assert counts[0] >= 100 and all(b - a >= 20 for a, b in itertools.pairwise(counts))

    summary, records, output = _ledge_run(tmp_path / "walks", play_action=0)
    assert summary["solved"] and summary["stop_reason"] == "solved"
    events = [r for r in records if r.get("event") in ("policy-check", "solved")]
    assert [(r["event"], r.get("mean_return")) for r in events] == [
        ("policy-check", 10.0),
        ("solved", None),
    ]
    # the summary keeps the moment it was solved, apart from what finished while it stopped
    at, solved = summary["solved_at"], events[-1]
    assert at["episodes"] == solved["episodes"] <= summary["episodes"]
    assert at["mean_return_100"] == 10.0 and at["env_steps"] <= summary["env_steps"]
    assert f"(solved after {at['wall_s']:.1f} s, {at['env_steps']:,} env steps: " in output


def test_children_exit_by_themselves_when_the_main_process_is_killed(installed, tmp_path):
    run_dir = tmp_path / "run"
    # probe has a Manager (its schema) and a train process: every kind of child is there
    with running([*PROBE_FOREVER, "--run-dir", str(run_dir)]) as proc:
        wait_for_metrics(run_dir)
        # every child up before the kill (the second worker starts after the first)
        wait_for_children(proc, {"mprl-manager", "mprl-worker-0", "mprl-worker-1", "mprl-trainer"})
        kids = child_pids(proc.pid)
        assert len(kids) >= 4  # Manager server, two workers, train process (+ resource tracker)
        proc.kill()
        proc.wait()
        start = time.monotonic()
        while [k for k in kids if alive(k)] and time.monotonic() - start < 10:
            time.sleep(0.1)
    left = [k for k in kids if alive(k)]
    assert not left, f"children still alive {time.monotonic() - start:.1f} s after SIGKILL"
    assert time.monotonic() - start < 5


def test_a_dead_manager_server_aborts_the_run_naming_it(installed, tmp_path):
    run_dir = tmp_path / "run"
    with running([*PROBE_FOREVER, "--run-dir", str(run_dir)]) as proc:
        wait_for_metrics(run_dir)
        names = wait_for_children(
            proc, {"mprl-manager", "mprl-worker-0", "mprl-worker-1", "mprl-trainer"}
        )
        (server,) = [k for k, name in names.items() if name == "mprl-manager"]
        os.kill(server, signal.SIGKILL)
        start = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "Manager server killed by signal SIGKILL" in stderr
    assert time.monotonic() - start < 15
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


@pytest.mark.parametrize(
    "args",
    [["plugins"], ["runs", "RUNS"], ["--help"], ["run", "--help"], ["sweep", "--help"]],
    ids=["plugins", "runs", "help", "run-help", "sweep-help"],
)
def test_a_command_whose_reader_is_gone_ends_without_a_traceback(installed, tmp_path, args):
    """``mprl plugins | head``: the reader of stdout gone before the command prints (the pipe's
    read end closed before it starts), what it prints is dropped and it ends as it would have."""
    runs = tmp_path / "runs"
    (runs / "one").mkdir(parents=True)
    (runs / "one" / "config.json").write_text('{"run": {"plugin": "a3c"}}')
    read, write = os.pipe()
    os.close(read)  # no reader: every write to stdout fails with EPIPE
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mprl", *[str(runs) if a == "RUNS" else a for a in args]],
            stdout=write, stderr=subprocess.PIPE, text=True, **own_group(),
        )  # fmt: skip
    finally:
        os.close(write)
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
