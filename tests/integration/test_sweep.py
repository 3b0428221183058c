"""``python -m mprl sweep`` as a user runs it: a grid through the CLI, its run directories and
results table; a sweep stopped with SIGINT once a run has finished, then resumed."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys

import pytest

from tests.conftest import cli, end, own_group, read_metrics, wait_until

TINY = ["--plugin", "a3c", "--workers", "1"]


def summary(path):
    return json.loads((path / "summary.json").read_text())


def test_a_grid_sweep_end_to_end(tmp_path):
    root = tmp_path / "sw"
    proc = cli("sweep", *TINY, "--total-steps", "1000", "--backend", "serial", "--grid", "lr=1e-3,3e-4", "--seeds", "2",
               "--parallel", "2", "--sweep-dir", str(root))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (root / "trials").iterdir())
    assert names == ["lr=1e-3-seed0", "lr=1e-3-seed1", "lr=3e-4-seed0", "lr=3e-4-seed1"]
    for name in names:  # each a normal run: its config has the grid's value and the seed
        config = json.loads((root / "trials" / name / "config.json").read_text())
        assert config["config"]["lr"] == float(name[3:7])
        assert config["run"]["seed"] == int(name[-1]) and config["run"]["total_steps"] == 1000
    progress = [line for line in proc.stderr.splitlines() if line.startswith("mprl sweep: [")]
    assert len(progress) == 4 and progress[-1].startswith("mprl sweep: [4/4] ")
    rows = {r["key"]: r for r in json.loads((root / "results.json").read_text())["rows"]}
    for key, row in rows.items():
        mine = [summary(root / "trials" / f"{key}-seed{s}") for s in (0, 1)]
        assert row["runs"] == 2 and row["solved"] == sum(m["solved"] for m in mine)
        assert row["best_return"] == max(m["best_return"] for m in mine)
        mean = sum(m["mean_return_100"] for m in mine) / 2
        assert abs(row["mean_return_100"] - mean) < 1e-9
        assert f"{mean:.1f}" in next(
            line for line in proc.stdout.splitlines() if row["config"] in line
        )
    with (root / "results.csv").open() as f:
        assert {r["key"] for r in csv.DictReader(f)} == set(rows)
    assert (root / "sweep.png").stat().st_size > 0
    # --report reads it all back from the run directories; the same command again runs nothing
    report = cli("sweep", "--report", str(root))
    assert report.returncode == 0 and report.stdout.splitlines()[:3] == proc.stdout.splitlines()[:3]
    again = cli("sweep", *TINY, "--total-steps", "1000", "--backend", "serial", "--grid", "lr=1e-3,3e-4", "--seeds", "2",
                "--sweep-dir", str(root))  # fmt: skip
    assert again.returncode == 0 and "(run " not in again.stderr


@pytest.mark.usefixtures("installed")
def test_a_sweep_stopped_with_sigint_resumes_where_it_was(tmp_path):
    root = tmp_path / "sw"
    # the test plugin's probe: the first config is over at once, the second takes 6 s of
    # sleeps (not of CPU, so a loaded machine does not shorten the window); it is stopped
    # once its worker has logged its start
    args = ["sweep", "--plugin", "probe", "--workers", "1", "--backend", "serial",
            "--total-steps", "600", "--grid", "step_sleep=0,0.01", "--seeds", "1",
            "--parallel", "1", "--sweep-dir", str(root)]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "mprl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **own_group())  # fmt: skip
    first, second = (
        root / "trials" / "step_sleep=0-seed0",
        root / "trials" / "step_sleep=0.01-seed0",
    )
    try:
        wait_until(lambda: (first / "summary.json").exists(), "the first run's summary", 150)
        wait_until(lambda: any("started" in r for r in read_metrics(second))
                   or proc.poll() is not None, "the second run's start", 150)  # fmt: skip
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        end(proc)
    assert proc.returncode == 130, err
    assert f"continue with: python -m mprl sweep --resume {root}" in err
    assert not (second / "summary.json").exists() or summary(second)["status"] == "interrupted"
    kept = (first / "summary.json").read_bytes(), (first / "summary.json").stat().st_mtime_ns
    resumed = cli("sweep", "--resume", str(root), timeout=90)
    assert resumed.returncode == 0, resumed.stderr
    assert kept == (
        (first / "summary.json").read_bytes(),
        (first / "summary.json").stat().st_mtime_ns,
    )
    assert "1 run at a time" in resumed.stderr  # --parallel as given
    assert "resuming: 1 configs done, 1 to run again" in resumed.stderr
    progress = [line for line in resumed.stderr.splitlines() if line.startswith("mprl sweep: [")]
    assert len(progress) == 1 and progress[0].startswith(
        "mprl sweep: [2/2] step_sleep=0.01 seed 0: "
    )
    assert summary(second)["status"] == "finished"
    rows = json.loads((root / "results.json").read_text())["rows"]
    assert sorted(r["key"] for r in rows) == ["step_sleep=0", "step_sleep=0.01"]
