"""The dqn plugin learning: a serial run on CartPole at its declared replay ratio (its parts and
its runs that check no learning are in tests/unit/test_dqn.py)."""

from __future__ import annotations

import statistics

import numpy as np

from tests.unit.test_dqn import SMALL, dqn_serial


def test_dqn_learns_cartpole_a_little_at_its_declared_replay_ratio():
    result = dqn_serial(total_steps=5000, workers=2, seed=0, config=SMALL)
    returns = result.episode_returns
    assert statistics.fmean(returns[-20:]) > 2 * statistics.fmean(returns[:20])
    state = result.state
    added, updates = state.replay.added(), state.updates.value
    assert added == result.summary.env_steps  # a row per env step
    # 1 update per steps_per_update (4) env steps after learning_starts: within one update's rows
    assert abs(updates - (added - 500) / 4) <= 1
    assert state.replay.sampled() == 32 * updates == state.weights.version * 32
    logged = [r for r in result.records if "loss" in r]
    assert logged and all(np.isfinite(r["loss"]) for r in logged)
