"""The A3C plugin's pieces, checked against independent computations, and a Box-action run."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from mprl.lib.nets import make_model
from mprl_builtin.a3c.algorithm import A3CConfig, _n_step_returns


def test_n_step_returns_bootstrap_and_stop_at_episode_ends():
    rewards = torch.tensor([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    dones = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    last_value = torch.tensor([10.0, 20.0])
    g = 0.5
    returns = _n_step_returns(rewards, dones, last_value, g)
    # env 0: the episode ends at t=1, so t=0 and t=1 do not see the bootstrap value
    assert returns[:, 0].tolist() == [1 + g * 1, 1.0, 1 + g * 10]
    # env 1: no episode end, everything bootstraps from 20
    assert returns[:, 1].tolist() == [
        1 + g * (2 + g * (3 + g * 20)),
        2 + g * (3 + g * 20),
        3 + g * 20,
    ]


def test_gaussian_log_prob_and_entropy_match_torch_normal():
    space = gym.spaces.Box(-2.0, 2.0, (3,))
    model = make_model(gym.spaces.Box(-1, 1, (4,)), space, A3CConfig())
    with torch.no_grad():
        model.log_std.copy_(torch.tensor([-0.5, 0.0, 0.3]))
    mean = torch.randn(5, 3)
    actions = torch.randn(5, 3)
    logp, entropy = model.log_prob_entropy(mean, actions)
    normal = torch.distributions.Normal(mean, model.log_std.exp())
    torch.testing.assert_close(logp, normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))
    clipped = model.to_env(torch.tensor([[5.0, -5.0, 1.0]]))
    assert clipped.tolist() == [[2.0, -2.0, 1.0]]


def test_categorical_log_prob_and_entropy_match_torch_categorical():
    model = make_model(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), A3CConfig())
    logits = torch.randn(6, 3)
    actions = torch.randint(0, 3, (6,))
    logp, entropy = model.log_prob_entropy(logits, actions)
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logp, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())


def test_a3c_config_rejects_bad_values():
    with pytest.raises(ValueError, match="gamma"):
        A3CConfig(gamma=1.5)
    with pytest.raises(ValueError, match="hidden"):
        A3CConfig(hidden=(64, 0))
