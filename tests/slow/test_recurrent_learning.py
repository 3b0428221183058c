"""Recurrent policies learn what a feed-forward one cannot: CartPole with its velocities masked
(mprl.lib.pomdp's CartPoleNoVelocity-v1) needs memory; ppo with ``core=lstm`` balances it, the
feed-forward ppo of the same budget stays far below; the recurrent run's checkpoint plays in
``mprl eval`` and resumes (the workers start from fresh hidden states)."""

from __future__ import annotations

import json

from tests.conftest import cli

ENV = "mprl.lib.pomdp:CartPoleNoVelocity-v1"
BUDGET = 100_000  # env steps; the recurrent run passes 195 near 50k (seed 1, 2 workers)
RECURRENT = ("--set", "core=lstm", "--set", "normalize_obs=true", "--set", "minibatch_size=512")


def _train(run_dir, *extra: str) -> dict:
    args = ("run", "--plugin", "ppo", "--env", ENV, "--workers", "2", "--seed", "1")
    proc = cli(*args, "--total-steps", str(BUDGET), "--run-dir", str(run_dir), "--quiet", *extra,
               timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads((run_dir / "summary.json").read_text())


def test_recurrent_ppo_balances_cartpole_without_velocities(tmp_path):
    recurrent = _train(tmp_path / "lstm", *RECURRENT)
    assert recurrent["mean_return_100"] >= 195, recurrent
    feed_forward = _train(tmp_path / "mlp", "--set", "normalize_obs=true")
    assert feed_forward["mean_return_100"] < 100, feed_forward  # its plateau: about 50
    proc = cli("eval", str(tmp_path / "lstm"), "--episodes", "5", timeout=120)  # mprl's module
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "lstm" / "eval.json").read_text())["mean_return"] >= 150
    if not recurrent["solved"]:  # a resumed recurrent run learns on
        more = str(BUDGET + 10_000)
        resume = ("run", "--resume", str(tmp_path / "lstm"), "--env", ENV)
        proc = cli(*resume, "--total-steps", more, "--quiet", timeout=120)
        assert proc.returncode == 0, proc.stderr
        resumed = json.loads((tmp_path / "lstm" / "summary.json").read_text())
        assert resumed["env_steps"] >= BUDGET + 10_000 and resumed["mean_return_100"] >= 150
