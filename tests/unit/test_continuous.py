"""mprl.lib.continuous, the parts of TD3 and SAC: action scaling onto a Box and back, warm-up
actions, Gaussian and Ornstein-Uhlenbeck noise against their statistics, Polyak averaging with
exact values, a schema.Module's target network on the learner's device, the twin critics and
the tanh actor."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from mprl.lib.continuous import (
    DeterministicActor,
    GaussianNoise,
    OrnsteinUhlenbeckNoise,
    TargetNetwork,
    TwinQ,
    box_bounds,
    plain_mlp,
    polyak_update,
    scale_action,
    uniform_actions,
    unscale_action,
)

BOX = gym.spaces.Box(np.array([-3.0, 0.0], np.float32), np.array([1.0, 10.0], np.float32))


# -- actions -------------------------------------------------------------------------------------


def test_scaling_maps_the_unit_interval_onto_the_bounds_and_back():
    low, high = box_bounds(BOX)
    assert low.tolist() == [-3.0, 0.0] and high.tolist() == [1.0, 10.0]
    ends = torch.tensor([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0], [0.5, -0.5]])
    assert scale_action(ends, low, high).tolist() == [
        [-3.0, 0.0], [-1.0, 5.0], [1.0, 10.0], [0.0, 2.5],
    ]  # fmt: skip
    x = torch.rand((1000, 2), generator=torch.Generator().manual_seed(0)) * 2 - 1
    scaled = scale_action(x, BOX.low, BOX.high)  # numpy bounds too
    assert (scaled >= low).all() and (scaled <= high).all()
    torch.testing.assert_close(unscale_action(scaled, low, high), x, rtol=0, atol=1e-6)
    torch.testing.assert_close(scale_action(unscale_action(scaled, low, high), low, high), scaled)
    # out of [-1, 1] (noise added): clipped to the bounds, or not
    out = torch.tensor([[2.0, -3.0]])
    assert scale_action(out, low, high).tolist() == [[1.0, 0.0]]
    assert scale_action(out, low, high, clip=False).tolist() == [[3.0, -10.0]]
    assert unscale_action(torch.tensor([[5.0, 20.0]]), low, high).tolist() == [[1.0, 1.0]]
    assert unscale_action(torch.tensor([[5.0, 20.0]]), low, high, clip=False).tolist() == [
        [3.0, 3.0]
    ]
    # on the action's dtype (and device)
    assert scale_action(x.double(), low, high).dtype == torch.float64


def test_bounds_must_be_finite_and_the_space_a_box():
    with pytest.raises(ValueError, match="must be finite"):
        box_bounds(gym.spaces.Box(-np.inf, np.inf, (2,)))
    with pytest.raises(ValueError, match="need a Box"):
        box_bounds(gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="must be finite"):
        uniform_actions(gym.spaces.Box(0.0, np.inf, (1,)), 4)


def test_warm_up_actions_are_uniform_over_the_box_and_repeat_for_a_seed():
    actions = uniform_actions(BOX, 40_000, torch.Generator().manual_seed(1))
    assert actions.shape == (40_000, 2) and actions.dtype == torch.float32
    low, high = box_bounds(BOX)
    assert (actions >= low).all() and (actions <= high).all()
    # a quarter of the draws in each quarter of each dimension's range (+- 4 standard errors)
    quarters = ((actions - low) / (high - low) * 4).floor().clamp(max=3)
    for dim in range(2):
        counts = torch.bincount(quarters[:, dim].long(), minlength=4).float() / 40_000
        assert (counts - 0.25).abs().max() < 4 * math.sqrt(0.25 * 0.75 / 40_000), counts
    # normalized: the same draws in [-1, 1], which scale_action maps onto these
    unit = uniform_actions(BOX, 40_000, torch.Generator().manual_seed(1), normalized=True)
    assert unit.min() >= -1.0 and unit.max() <= 1.0 and unit.min() < -0.99 and unit.max() > 0.99
    torch.testing.assert_close(scale_action(unit, low, high), actions)
    again = uniform_actions(BOX, 5, torch.Generator().manual_seed(1))
    assert torch.equal(again, actions[:5])
    shaped = gym.spaces.Box(-1.0, 1.0, (2, 3))
    assert uniform_actions(shaped, 4).shape == (4, 2, 3)


# -- noise ---------------------------------------------------------------------------------------


def test_gaussian_noise_has_its_sigma_per_dimension_and_repeats_for_a_seed():
    noise = GaussianNoise(
        20_000, 2, torch.tensor([0.1, 0.5]), generator=torch.Generator().manual_seed(2)
    )
    drawn = noise.sample()
    assert drawn.shape == (20_000, 2)
    std, mean = drawn.std(0), drawn.mean(0)
    assert torch.allclose(std, torch.tensor([0.1, 0.5]), rtol=0.03)
    assert (mean.abs() < 4 * torch.tensor([0.1, 0.5]) / math.sqrt(20_000)).all()
    assert not torch.equal(noise.sample(), drawn)  # a new draw each step
    noise.reset([0, 1])  # nothing to reset, as OU's is called
    first = GaussianNoise(3, (2,), 0.3, generator=torch.Generator().manual_seed(7)).sample()
    second = GaussianNoise(3, (2,), 0.3, generator=torch.Generator().manual_seed(7)).sample()
    assert torch.equal(first, second)


def test_ornstein_uhlenbeck_noise_reverts_to_its_mean_with_its_stationary_variance():
    theta, dt, sigma = 1.0, 0.1, 0.3
    decay = 1 - theta * dt  # 0.9 a step
    # without randomness the state decays to mu geometrically
    calm = OrnsteinUhlenbeckNoise(2, 1, sigma=0.0, theta=theta, dt=dt, mu=0.5, x0=2.5)
    for _ in range(10):
        calm.sample()
    torch.testing.assert_close(calm.state, torch.full((2, 1), 0.5 + 2.0 * decay**10))
    # with it: the mean of many envs' processes follows that decay ...
    n = 20_000
    noise = OrnsteinUhlenbeckNoise(
        n, 1, sigma=sigma, theta=theta, dt=dt, x0=2.0, generator=torch.Generator().manual_seed(3)
    )
    stationary_var = sigma**2 * dt / (1 - decay**2)
    for k in range(1, 6):
        x = noise.sample()
        var_k = stationary_var * (1 - decay ** (2 * k))
        assert abs(x.mean().item() - 2.0 * decay**k) < 4 * math.sqrt(var_k / n)
    # ... and settles at the stationary variance, correlated from step to step by the decay
    for _ in range(200):
        x = noise.sample()
    nxt = noise.sample()
    assert abs(x.mean().item()) < 4 * math.sqrt(stationary_var / n)
    assert x.var().item() == pytest.approx(stationary_var, rel=0.05)
    corr = torch.corrcoef(torch.stack([x.flatten(), nxt.flatten()]))[0, 1].item()
    assert corr == pytest.approx(decay, abs=0.01)


def test_ornstein_uhlenbeck_noise_resets_the_envs_whose_episode_ended():
    noise = OrnsteinUhlenbeckNoise(4, 2, generator=torch.Generator().manual_seed(4))
    assert torch.equal(noise.state, torch.zeros(4, 2))  # x0: 0, as SB3's
    for _ in range(5):
        drawn = noise.sample()
    assert torch.equal(drawn, noise.state) and (drawn != 0).all()
    drawn += 1.0  # a copy: the caller cannot move the state
    before = noise.state.clone()
    noise.reset([0, 2])
    assert torch.equal(noise.state[[0, 2]], torch.zeros(2, 2))
    assert torch.equal(noise.state[[1, 3]], before[[1, 3]])  # the others go on
    noise.reset([])
    assert torch.equal(noise.state[[1, 3]], before[[1, 3]])
    noise.reset()
    assert torch.equal(noise.state, torch.zeros(4, 2))
    a = OrnsteinUhlenbeckNoise(2, 1, generator=torch.Generator().manual_seed(5))
    b = OrnsteinUhlenbeckNoise(2, 1, generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(a.sample(), b.sample()) for _ in range(3))


# -- targets -------------------------------------------------------------------------------------


class WithBuffer(nn.Module):
    def __init__(self, weight: float, bias: float, stat: float) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        nn.init.constant_(self.lin.weight, weight)
        nn.init.constant_(self.lin.bias, bias)
        self.register_buffer("stat", torch.full((2,), stat))


@pytest.mark.parametrize(
    ("tau", "weight", "bias"),
    [(0.0, 4.0, -2.0), (1.0, 0.0, 6.0), (0.5, 2.0, 2.0), (0.25, 3.0, 0.0)],
)
def test_polyak_moves_the_target_a_fraction_tau_towards_the_source(tau, weight, bias):
    target, source = WithBuffer(4.0, -2.0, 1.0), WithBuffer(0.0, 6.0, 9.0)
    weight_before = target.lin.weight
    polyak_update(target, source, tau)
    # exact: (1 - tau) * target + tau * source for numbers binary fractions hold exactly
    assert torch.equal(target.lin.weight, torch.full((2, 2), weight))
    assert torch.equal(target.lin.bias, torch.full((2,), bias))
    assert torch.equal(target.stat, torch.full((2,), 9.0))  # buffers copied
    assert target.lin.weight is weight_before and target.lin.weight.grad_fn is None  # in place
    assert torch.equal(source.lin.weight, torch.zeros(2, 2))  # the source untouched


def test_polyak_repeated_converges_geometrically_and_refuses_what_is_no_copy():
    target, source = nn.Linear(3, 1), nn.Linear(3, 1)
    gap = (target.weight - source.weight).detach().clone()
    for _ in range(10):
        polyak_update(target.parameters(), source.parameters(), 0.1)  # lists of tensors too
    torch.testing.assert_close(target.weight - source.weight, gap * 0.9**10)
    with pytest.raises(ValueError, match=r"tau must be in \[0, 1\]"):
        polyak_update(target, source, 1.5)
    with pytest.raises(ValueError, match="a target is a copy of its source"):
        polyak_update(target, nn.Sequential(nn.Linear(3, 1), nn.Linear(1, 1)), 0.5)
    with pytest.raises(ValueError, match="the target is on meta and the source on cpu"):
        polyak_update(nn.Linear(3, 1, device="meta"), source, 0.5)


def test_a_target_network_on_the_fields_device_is_the_field_updated_in_place():
    field = WithBuffer(4.0, -2.0, 1.0)
    target = TargetNetwork(field, "cpu")
    assert target.module is field and not target.copied
    target.polyak(WithBuffer(0.0, 6.0, 9.0), 0.5)
    assert torch.equal(field.lin.weight, torch.full((2, 2), 2.0))  # at once, no sync needed
    x = torch.ones(1, 2)
    assert torch.equal(target.module.lin(x), field.lin(x))


def test_a_target_network_copy_is_loaded_back_into_the_field_every_sync_every_updates():
    field = WithBuffer(4.0, -2.0, 1.0)
    target = TargetNetwork(field, "cpu", sync_every=3, copy=True)  # as on a GPU
    assert target.copied and target.module is not field
    source = WithBuffer(0.0, 6.0, 9.0)
    target.polyak(source, 0.5)
    target.polyak(source, 0.5)
    assert torch.equal(target.module.lin.weight, torch.full((2, 2), 1.0))
    assert torch.equal(field.lin.weight, torch.full((2, 2), 4.0))  # not yet
    target.polyak(source, 0.5)  # the third: loaded into the field
    assert torch.equal(field.lin.weight, torch.full((2, 2), 0.5))
    target.copy_from(WithBuffer(7.0, 7.0, 7.0))
    assert torch.equal(target.module.lin.bias, torch.full((2,), 7.0))
    assert torch.equal(field.lin.bias, torch.full((2,), 6.0 - 8.0 * 0.5**3))
    target.sync()
    assert torch.equal(field.lin.bias, torch.full((2,), 7.0)) and torch.equal(
        field.stat, field.stat
    )
    with pytest.raises(ValueError, match="sync_every"):
        TargetNetwork(field, sync_every=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here")
def test_a_target_network_of_a_gpu_learner_is_updated_on_the_gpu():
    field = WithBuffer(4.0, -2.0, 1.0)
    target = TargetNetwork(field, "cuda", sync_every=2)
    assert target.copied and target.module.lin.weight.is_cuda and not field.lin.weight.is_cuda
    source = WithBuffer(0.0, 6.0, 9.0).cuda()
    target.polyak(source, 0.5)
    assert torch.equal(field.lin.weight, torch.full((2, 2), 4.0))
    assert torch.equal(target.module.lin.weight.cpu(), torch.full((2, 2), 2.0))
    target.polyak(source, 0.5)
    assert torch.equal(field.lin.weight, torch.full((2, 2), 1.0))
    with pytest.raises(ValueError, match="the target is on cpu and the source on cuda"):
        polyak_update(field, source, 0.5)


# -- networks ------------------------------------------------------------------------------------


def test_twin_q_min_is_the_smaller_of_its_two_networks():
    torch.manual_seed(0)
    critic = TwinQ(3, 2, (16, 16))
    obs, act = torch.randn(64, 3), torch.rand(64, 2) * 2 - 1
    q1, q2 = critic(obs, act)
    assert q1.shape == q2.shape == (64,)
    x = torch.cat([obs, act], -1)
    assert torch.equal(q1, critic.q1(x).squeeze(-1)) and torch.equal(q2, critic.q2(x).squeeze(-1))
    low = critic.min(obs, act)
    assert torch.equal(low, torch.where(q1 < q2, q1, q2))
    assert (q1 < q2).any() and (q2 < q1).any()  # both networks are the smaller somewhere
    assert torch.equal(critic.first(obs, act), q1)
    # observations and actions of any shape are flattened per row
    assert torch.equal(critic.min(obs.reshape(64, 3, 1), act.reshape(64, 1, 2)), low)
    # the state dict's names: two Sequentials of Linear/ReLU (the built-in sac's checkpoints)
    assert list(critic.state_dict()) == [
        f"{q}.{i}.{p}" for q in ("q1", "q2") for i in (0, 2, 4) for p in ("weight", "bias")
    ]


def test_the_deterministic_actor_acts_inside_the_unit_interval():
    torch.manual_seed(0)
    actor = DeterministicActor(4, 3, (32,))
    assert actor(torch.randn(8, 2, 2)).shape == (8, 3)
    far = actor(torch.randn(256, 4) * 1e4)  # saturated: still inside
    assert far.abs().max() <= 1.0 and far.abs().max() > 0.999
    torch.testing.assert_close(actor(torch.zeros(1, 4)), torch.tanh(actor.net(torch.zeros(1, 4))))


def test_a_plain_mlp_has_torchs_default_initialisation():
    torch.manual_seed(0)
    net = plain_mlp(50, (200, 100), 3, "tanh")
    assert [type(m) for m in net] == [nn.Linear, nn.Tanh, nn.Linear, nn.Tanh, nn.Linear]
    assert net[-1].out_features == 3
    for layer in (net[0], net[2], net[4]):
        bound = 1 / math.sqrt(layer.in_features)
        for p in (layer.weight, layer.bias):  # uniform in +- 1/sqrt(fan_in)
            assert p.abs().max() <= bound
        assert layer.weight.abs().max() > 0.95 * bound  # (hundreds of draws reach the edge)
    torch.manual_seed(0)  # the same layers, built in the same order, as nn.Linear would
    expected = nn.Linear(50, 200)
    assert torch.equal(net[0].weight, expected.weight)


@pytest.mark.parametrize("out_gain", [0.01, 1.0])
def test_mlp_is_initialised_as_its_docstring_says(out_gain):
    """mprl.lib.nets.mlp, the other MLP: orthogonal weights (every singular value the gain),
    zero biases, sqrt(2) for the hidden layers and out_gain for the output layer."""
    from mprl.lib.nets import mlp

    net = mlp(12, (64, 32), 5, out_gain, "relu")
    assert [type(m) for m in net] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    for layer, gain in ((net[0], math.sqrt(2)), (net[2], math.sqrt(2)), (net[-1], out_gain)):
        singular = torch.linalg.svdvals(layer.weight.detach())
        torch.testing.assert_close(singular, torch.full_like(singular, gain))
        assert torch.equal(layer.bias, torch.zeros_like(layer.bias))
