"""A run with EnvPool solves CartPole-v1 like one with gymnasium's envs (``--env-batch envpool``)."""

from __future__ import annotations

import numpy as np
import pytest

from mprl.testing import run_serial


def test_a_run_with_envpool_solves_cartpole_like_one_with_gym():
    pytest.importorskip("envpool")
    result = run_serial("ppo", env="CartPole-v1", env_batch="envpool", total_steps=60_000, seed=1)
    returns = result.episode_returns
    assert result.summary.solved or np.mean(returns[-20:]) > 300, np.mean(returns[-20:])
    # episodes of CartPole pay 1 a step: each logged return is its length, up to the limit
    assert all(1 <= r <= 500 and r == int(r) for r in returns)
