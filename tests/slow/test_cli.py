"""The CLI as a user runs it: a subprocess, exit codes, messages, the run directory."""

from __future__ import annotations

import json

import pytest

from tests.conftest import (
    cli,
    read_metrics,
)


@pytest.mark.parametrize("plugin", ["a3c", "impala", "ppo"])
def test_built_in_defaults_solve_cartpole(tmp_path, plugin):
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", plugin, "--run-dir", str(run_dir), "--quiet", timeout=280)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] and summary["stop_reason"] == "solved"
    records = read_metrics(run_dir)
    (solved,) = [r for r in records if r.get("event") == "solved"]
    assert solved["mean_return_100"] >= 475
    episodes = [r for r in records if "episode_return" in r][: solved["episodes"]]
    assert sum(r["episode_return"] for r in episodes[-100:]) / 100 >= 475  # from the file too
    # and `mprl eval` plays the policy the run saved as well as the run said: it did not drift
    # off after solving (the margin below 475 is for 20 other episodes of sampled actions; a3c's
    # policy, the steadiest, gets the narrower one)
    proc = cli("eval", str(run_dir), "--episodes", "20", timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["episodes"] == 20 and len(result["returns"]) == 20
    assert result["mean_return"] >= (450 if plugin == "a3c" else 400), result["returns"]
    assert f"return {result['mean_return']:.1f} ± {result['std_return']:.1f}" in proc.stdout
    assert "sampled actions" in proc.stdout
    proc = cli("eval", str(run_dir), "--episodes", "3", "--deterministic", timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["deterministic"] is True and "deterministic" in proc.stdout
