"""The serial backend (``run --serial``): every process a turn-taking thread of this one."""

from __future__ import annotations

import json

from tests.conftest import cli, cli_here


def test_cli_serial_stops_at_breakpoint_with_a_prompt(installed, tmp_path):
    # pdb reads this process's stdin: in a spawned child it would read /dev/null and quit
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "probe", "--serial", "--workers", "2", "--total-steps", "300",
        "--env", "Corridor-v0", "--run-dir", str(run_dir), "--quiet",
        "--set", "fault=breakpoint", "--set", "fault_rank=1", "--set", "fault_at_step=7",
        stdin="p ctx.rank\nup\np steps\nc\n",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "(Pdb) 1\n" in proc.stdout and "(Pdb) 7\n" in proc.stdout  # rank 1, at step 7
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] >= 300


def test_cli_serial_contradicting_backend_is_a_usage_error(installed, capsys):
    code, err = cli_here(capsys, "run", "--plugin", "probe", "--serial", "--backend", "local")
    assert code == 2
    assert "--serial and --backend local contradict each other" in err
