"""Faults at the backends' edges (issue 27): what a plugin leaves running, a silent Manager
server. Each case is a real run through the CLI."""

from __future__ import annotations

import time

from tests.conftest import cli, read_metrics


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


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
