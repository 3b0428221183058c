"""``python -m mprl eval``: a trained policy played from its checkpoint, through the CLI."""

from __future__ import annotations

import json

from tests.conftest import cli


def _train(run_dir, *args: str) -> None:
    proc = cli("run", "--run-dir", str(run_dir), "--quiet", *args, timeout=280)
    assert proc.returncode == 0, proc.stderr


def test_a_solved_cartpole_policy_plays_as_well_in_eval_as_the_run_said(tmp_path):
    run_dir = tmp_path / "run"
    _train(run_dir, "--plugin", "a3c")
    proc = cli("eval", str(run_dir), "--episodes", "20")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["episodes"] == 20 and len(result["returns"]) == 20
    # the run played this policy for 10 sampled episodes (mean >= 475) before it stopped
    # solved; 20 other episodes may score a little lower, not much
    assert result["mean_return"] >= 450, result["returns"]
    assert f"return {result['mean_return']:.1f} ± {result['std_return']:.1f}" in proc.stdout
    assert "sampled actions" in proc.stdout
    proc = cli("eval", str(run_dir), "--episodes", "3", "--deterministic")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["deterministic"] is True and "deterministic" in proc.stdout
