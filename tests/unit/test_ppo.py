"""The ppo plugin: GAE, the synchronous barrier between workers and learner, real CLI runs."""

from __future__ import annotations

import pytest
import torch

from mprl_builtin.ppo import PPOConfig, gae


def test_gae_spans_td_error_to_monte_carlo_and_stops_at_episode_ends():
    torch.manual_seed(0)
    t_len, n, gamma = 6, 3, 0.9
    rewards, values = torch.randn(t_len, n), torch.randn(t_len + 1, n)
    dones = torch.zeros(t_len, n)
    dones[2, 0] = dones[4, 1] = 1.0
    live = 1.0 - dones
    # lambda 0: the one-step TD error, with no bootstrap across an episode end
    td = rewards + gamma * values[1:] * live - values[:-1]
    assert torch.allclose(gae(rewards, dones, values, gamma, 0.0), td, atol=1e-6)
    # lambda 1: the discounted return to the episode end (or the bootstrap) minus the value
    returns, running_return = torch.empty(t_len, n), values[-1]
    for t in range(t_len - 1, -1, -1):
        running_return = rewards[t] + gamma * running_return * live[t]
        returns[t] = running_return
    assert torch.allclose(gae(rewards, dones, values, gamma, 1.0), returns - values[:-1], atol=1e-5)


def test_ppo_config_rejects_bad_values():
    with pytest.raises(ValueError, match="gae_lambda"):
        PPOConfig(gae_lambda=1.5)
    with pytest.raises(ValueError, match="minibatch_size"):
        PPOConfig(minibatch_size=0)
