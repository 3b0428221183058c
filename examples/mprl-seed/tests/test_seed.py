"""The seed example's own tests: its registration, and serial runs in the test's process."""

from __future__ import annotations

import statistics

import mprl_seed
import torch

from mprl.testing import registered


def test_registers_the_seed_algorithm_with_its_control_state() -> None:
    algo = registered(mprl_seed)["seed"]
    assert algo.train is mprl_seed.train and algo.worker is mprl_seed.worker
    assert set(algo.schema.fields) == {
        "episodes", "steps", "loss_history", "n_iters", "lock", "ready",
    }  # fmt: skip
    assert algo.config_cls() == mprl_seed.Config(lr=0.01, gamma=0.99, batch_episodes=8)


def test_returns_discount_from_the_end_of_the_episode() -> None:
    assert mprl_seed.returns_of([1.0, 1.0, 1.0], 0.5).tolist() == [1.75, 1.5, 1.0]


def test_workers_feed_the_learner_and_the_control_state_adds_up(mprl_pm, mprl_serial) -> None:
    mprl_pm.register(mprl_seed)
    result = mprl_serial("seed", workers=2, total_steps=3000, seed=1)
    state, summary = result.state, result.summary
    assert summary.status == "finished" and summary.stop_reason == "total steps reached"
    assert sum(state.steps) == summary.env_steps  # every worker counted its own steps
    assert min(state.steps) > 0
    assert state.n_iters.value == len(state.loss_history) > 0  # changed together, under the lock
    losses = [r["loss"] for r in result.records if "loss" in r]
    assert losses == list(state.loss_history)
    assert state.ready.is_set()


def test_a_serial_run_repeats_for_a_seed(mprl_pm, mprl_serial) -> None:
    mprl_pm.register(mprl_seed)
    a, b = (mprl_serial("seed", workers=2, total_steps=2000, seed=3) for _ in "ab")
    assert a.episode_returns == b.episode_returns and len(a.episode_returns) > 20
    pairs = zip(a.model.parameters(), b.model.parameters(), strict=True)
    assert all(torch.equal(x, y) for x, y in pairs)


def test_the_learner_improves_the_policy(mprl_pm, mprl_serial) -> None:
    mprl_pm.register(mprl_seed)
    returns = mprl_serial("seed", workers=2, total_steps=30_000, seed=0).episode_returns
    assert statistics.fmean(returns[-20:]) > 2 * statistics.fmean(returns[:20])
