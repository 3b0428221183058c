"""The sac plugin: its policy (the act contract, squashing into the bounds), real serial runs
that learn Pendulum and repeat for a seed, a spawned run resumed with its target critic,
counters, optimizers and replay buffer, and the Discrete action spaces it refuses."""

from __future__ import annotations

import numpy as np
import torch

from mprl_builtin.sac import SACConfig
from tests.unit.test_sac import sac_serial

# small networks and batches: a serial run on two shared cores learns Pendulum in seconds
SMALL = {"hidden": [64, 64], "lr": 1e-3, "batch_size": 128, "learning_starts": 1000}


def test_sac_learns_pendulum_in_a_serial_run():
    result = sac_serial(total_steps=8000, seed=0, config=SMALL)
    returns = result.episode_returns
    assert len(returns) == 40  # 200 steps each: every episode ends by the time limit
    assert np.mean(returns[:5]) < -700  # the random actions of the first 1000 steps
    assert np.mean(returns[-10:]) > -400, returns  # (-229 here, -133 and -136 with seeds 1, 2)
    state = result.state
    # a time-limit truncation is no terminal state: nothing is marked done, all bootstraps
    assert state.replay.size() == 8000 and float(state.replay.buffers["done"].sum()) == 0.0
    assert state.replay.buffers["action"].abs().max() <= 1.0  # the policy's units, squashed
    # one update per env step after learning_starts (serial: the learner keeps level)
    assert 8000 - 1000 - SACConfig().max_lead <= state.updates.value <= 8000 - 1000
    assert state.updates.value == state.weights.version  # each update published the policy
    learner = [r for r in result.records if r["source"] == "trainer"]
    assert learner and learner[-1]["updates"] == state.updates.value
    assert 0.0 < learner[-1]["alpha"] < 1.0  # tuned down from 1 towards the target entropy
    # the target critics trail the critics (Polyak averaging), they are no copy of them
    critic, target = result.model.critic.state_dict(), state.target.critic.state_dict()
    assert all(not torch.equal(critic[k], target[k]) for k in critic)
