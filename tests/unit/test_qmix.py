"""The built-in vdn and qmix plugins: QMIX's mixer is monotonic in every agent's Q, VDN's is the
sum, the TD target is the target networks' and stops at a terminal step, the epsilon schedule
and the per-agent epsilon-greedy choice; serial runs that keep the declared replay ratio and
play their greedy agents (act, export_policy)."""

from __future__ import annotations

import attrs
import gymnasium as gym
import numpy as np
import pytest
import torch

from mprl.spaces import AgentBox
from mprl.testing import run_serial
from mprl_builtin import qmix
from mprl_builtin.qmix import AgentsQ, QMIXConfig, QMixer, VDNConfig, VDNMixer
from mprl_builtin.qmix.algorithm import (
    agents_epsilon_greedy,
    chosen_q_tot,
    epsilon,
    replay_ratio,
    td_target,
)

ENV = "mpe2:simple_spread_v3(N=2, max_cycles=10)"
SMALL = {
    "hidden": [32], "learning_starts": 100, "batch_size": 16, "steps_per_update": 4,
    "buffer_size": 2000, "target_update": 10, "exploration_steps": 200,
}  # fmt: skip


def spaces(agents: int = 3, features: int = 4, state: int = 7, actions: int = 5):
    names = tuple(f"agent_{i}" for i in range(agents))
    state_space = gym.spaces.Box(-np.inf, np.inf, (state,), np.float32)
    obs = AgentBox(names, [features] * agents, state_space)
    return obs, gym.spaces.MultiDiscrete([actions] * agents)


def batch(b: int = 8, agents: int = 3, features: int = 4, state: int = 7, done: float = 0.0):
    g = torch.Generator().manual_seed(1)
    return {
        "obs": torch.randn(b, agents, features, generator=g),
        "state": torch.randn(b, state, generator=g),
        "action": torch.randint(5, (b, agents), generator=g),
        "reward": torch.randn(b, generator=g),
        "next_obs": torch.randn(b, agents, features, generator=g),
        "next_state": torch.randn(b, state, generator=g),
        "done": torch.full((b,), done),
    }


def test_qmix_s_team_value_is_monotonic_in_every_agent_s_q():
    torch.manual_seed(0)
    mixer = QMixer(n_agents=3, state_dim=7, embed=8, hyper=16)
    for layer in mixer.modules():  # weights of both signs, large: monotonic all the same
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.normal_(layer.weight, std=2.0)
    qs = torch.randn(256, 3, requires_grad=True)
    state = torch.randn(256, 7)
    (grad,) = torch.autograd.grad(mixer(qs, state).sum(), qs)
    assert (grad >= 0).all() and (grad > 0).any()
    # raising one agent's Q never lowers the team's
    for a in range(3):
        higher = qs.detach().clone()
        higher[:, a] += torch.rand(256) * 3
        assert (mixer(higher, state) >= mixer(qs.detach(), state) - 1e-5).all()
    # the state matters (unlike VDN's sum)
    assert not torch.allclose(mixer(qs, state), mixer(qs, torch.randn(256, 7)))


def test_vdn_s_team_value_is_the_sum_of_the_chosen_agents_q():
    obs_space, act_space = spaces()
    model = AgentsQ(obs_space, act_space, VDNConfig(hidden=(16,)))
    assert isinstance(model.mixer, VDNMixer)
    assert list(model.mixer.parameters()) == []
    data = batch()
    q = model.q_values(data["obs"])
    by_hand = sum(q[torch.arange(8), a, data["action"][:, a]] for a in range(3))
    torch.testing.assert_close(chosen_q_tot(model, data), by_hand)
    mixed = AgentsQ(obs_space, act_space, QMIXConfig(hidden=(16,)))
    assert isinstance(mixed.mixer, QMixer)


@pytest.mark.parametrize("config_cls", [VDNConfig, QMIXConfig])
@pytest.mark.parametrize("double", [True, False])
def test_the_td_target_is_the_target_networks_and_stops_at_a_terminal(config_cls, double):
    obs_space, act_space = spaces()
    torch.manual_seed(0)
    model = AgentsQ(obs_space, act_space, config_cls(hidden=(16,)))
    target = AgentsQ(obs_space, act_space, config_cls(hidden=(16,)))  # other weights
    data = batch()
    wanted = td_target(model, target, data, gamma=0.9, double=double)
    picker = model if double else target
    best = picker.q_values(data["next_obs"]).argmax(-1, keepdim=True)
    next_q = target.q_values(data["next_obs"]).gather(-1, best).squeeze(-1)
    by_hand = data["reward"] + 0.9 * target.mixer(next_q, data["next_state"])
    torch.testing.assert_close(wanted, by_hand.detach())
    # not the online networks' values
    own = model.q_values(data["next_obs"]).gather(-1, best).squeeze(-1)
    assert not torch.allclose(wanted, data["reward"] + 0.9 * model.mixer(own, data["next_state"]))
    # a terminal step: the reward alone
    ended = batch(done=1.0)
    torch.testing.assert_close(td_target(model, target, ended, 0.9, double), ended["reward"])


def test_epsilon_is_random_until_learning_starts_then_falls_linearly():
    cfg = VDNConfig(learning_starts=100, exploration_steps=1000, exploration_final_eps=0.05)
    assert epsilon(cfg, 0) == epsilon(cfg, 99) == 1.0
    assert epsilon(cfg, 100) == 1.0
    assert epsilon(cfg, 600) == pytest.approx(1.0 - 0.95 * 0.5)
    assert epsilon(cfg, 1100) == epsilon(cfg, 10**6) == 0.05


def test_epsilon_greedy_per_agent_keeps_to_each_agent_s_actions():
    q = torch.randn(500, 2, 4)
    assert torch.equal(agents_epsilon_greedy(q, None, 0.0), q.argmax(-1))
    mask = torch.tensor([[True, True, True, True], [True, False, True, False]])
    g = torch.Generator().manual_seed(0)
    actions = agents_epsilon_greedy(q.masked_fill(~mask, -1e9), mask, 1.0, g)
    assert set(actions[:, 0].tolist()) == {0, 1, 2, 3}
    assert set(actions[:, 1].tolist()) == {0, 2}  # never an action agent 1 does not have
    half = agents_epsilon_greedy(q, None, 0.5, g)
    assert 0.55 < (half == q.argmax(-1)).float().mean() < 0.75  # greedy + a random hit 1/4


@pytest.mark.parametrize("name", ["vdn", "qmix"])
def test_a_serial_run_keeps_its_ratio_and_plays_its_greedy_agents(name):
    torch.set_num_threads(1)
    result = run_serial(name, plugins=[qmix], env=ENV, total_steps=600, workers=2, seed=0,
                        config=SMALL)  # fmt: skip
    state = result.state
    added, updates = state.replay.added(), state.updates.value
    assert added == result.summary.env_steps >= 600  # a row per team step
    dims = type("D", (), {"config": attrs.evolve(QMIXConfig(), **{
        k: tuple(v) if isinstance(v, list) else v for k, v in SMALL.items()})})()  # fmt: skip
    assert replay_ratio(dims) == 16 / 4
    # an update per 4 rows after 100, the workers at most 4 rows (+ a step each) ahead
    assert (added - 100) / 4 - 3 <= updates <= (added - 100) / 4
    assert state.replay.sampled() == 16 * updates == 16 * state.weights.version
    assert result.episode_returns and all(np.isfinite(result.episode_returns))
    model = result.model
    obs = torch.randn(5, 2, model.agent[0].in_features - 2)
    greedy = model.act(obs, deterministic=True)
    assert greedy.shape == (5, 2) and greedy.dtype == np.int64
    np.testing.assert_array_equal(model.export_policy()(obs).numpy(), greedy)
    target = state.target
    assert set(target.state_dict()) == set(model.state_dict())
