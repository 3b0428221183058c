"""The TD3 example's own tests, written with mprl.testing (``pytest`` in examples/mprl-td3, the
plugin installed): the registration and the model, the worker and the train function called
one at a time on a Bench, and a serial run that learns Pendulum."""

from __future__ import annotations

import statistics

import gymnasium as gym
import mprl_td3
import numpy as np
import pytest
import torch

import mprl
from mprl import schema
from mprl.errors import UsageError
from mprl.lib.continuous import GaussianNoise, OrnsteinUhlenbeckNoise
from mprl.testing import Bench, registered

PENDULUM = gym.spaces.Box(-8.0, 8.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
SMALL = {"hidden": [32, 32], "batch_size": 32, "learning_starts": 100, "max_lead": 200}


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_registers_td3_for_box_actions_with_a_declared_replay_ratio() -> None:
    algo = registered(mprl_td3)["td3"]
    assert algo.worker is mprl_td3.worker and algo.train is mprl_td3.train
    assert set(algo.optimizers) == {"actor", "critic"} and algo.default_env == "Pendulum-v1"
    assert algo.supports(PENDULUM[1]) and not algo.supports(gym.spaces.Discrete(2))
    assert set(algo.schema.fields) == {"replay", "weights", "target", "updates"}
    # rows sampled per row added: gradient_steps batches every steps_per_update steps
    config = mprl_td3.TD3Config(batch_size=64, gradient_steps=2, steps_per_update=4)
    assert mprl_td3.replay_ratio(schema.Dims(2, *PENDULUM, config)) == 32.0


def test_bad_config_values_are_refused_naming_the_field(mprl_pm, mprl_serial) -> None:
    mprl_pm.register(mprl_td3)
    with pytest.raises(mprl.ConfigError, match="field 'noise'"):
        mprl_serial("td3", config={"noise": "pink"})
    with pytest.raises(mprl.ConfigError, match="field 'policy_delay'"):
        mprl_serial("td3", config={"policy_delay": 0})


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
def test_the_model_acts_inside_the_bounds_and_greedily_when_deterministic() -> None:
    torch.manual_seed(0)
    model = mprl_td3.make_model(*PENDULUM, mprl_td3.TD3Config(hidden=(16,)))
    obs = torch.randn(64, 3) * 100  # far outside: the tanh saturates
    for deterministic in (True, False):
        actions = model.act(obs, deterministic)
        assert isinstance(actions, np.ndarray) and actions.shape == (64, 1)
        assert (actions >= -2.0).all() and (actions <= 2.0).all()
    near = torch.randn(8, 3)
    greedy = model.act(near, True)
    with torch.no_grad():  # tanh of the actor's output, scaled from [-1, 1] to [-2, 2]
        expected = 2.0 * torch.tanh(model.actor.net(near)).numpy()
    np.testing.assert_allclose(greedy, expected, atol=1e-6)
    assert not np.array_equal(model.act(near, False), greedy)  # with exploration noise
    # mprl export's module: the same actions, traced from tensor operations alone
    policy = model.export_policy()
    assert policy.state_shapes == {} and "critic" not in dict(policy.named_modules())
    traced = torch.jit.trace(policy, near)
    np.testing.assert_allclose(traced(obs[:8]).detach().numpy(), model.act(obs[:8], True))
    unbounded = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    with pytest.raises(UsageError, match="must be finite"):
        mprl_td3.make_model(PENDULUM[0], unbounded, mprl_td3.TD3Config())


def test_the_exploration_noise_is_the_configured_kind() -> None:
    gen = torch.Generator().manual_seed(0)
    ou = mprl_td3.make_noise(mprl_td3.TD3Config(noise="ou"), 4, (1,), gen)
    gaussian = mprl_td3.make_noise(mprl_td3.TD3Config(noise_sigma=0.3), 4, (1,), gen)
    assert isinstance(ou, OrnsteinUhlenbeckNoise) and ou.state.shape == (4, 1)
    assert isinstance(gaussian, GaussianNoise) and float(gaussian.sigma) == pytest.approx(0.3)


def test_the_worker_warms_up_uniformly_then_acts_with_the_actor_plus_noise() -> None:
    bench = Bench(mprl_td3.ALGORITHM, workers=1, config={**SMALL, "noise_sigma": 0.2}, seed=3)
    mprl_td3.worker(bench.context(0, steps=250))  # 100 warm-up steps, then 150 of the actor's
    replay = bench.state.replay
    assert replay.size() == bench.env_steps == 250
    actions, obs = replay.buffers["action"][:250, 0], replay.buffers["obs"][:250]
    warm_up, acting = actions[:100], actions[100:]
    # stored in the actor's units, [-1, 1]; the warm-up spread over all of it
    assert actions.abs().max() <= 1.0 and warm_up.min() < -0.8 and warm_up.max() > 0.8
    # then the (untrained) actor's action plus N(0, 0.2), clipped: the noise has that scale
    with torch.no_grad():
        greedy = bench.model.policy(obs[100:])[:, 0]
    noise = (acting - greedy)[acting.abs() < 1.0]
    assert 0.15 < float(noise.std()) < 0.25 and abs(float(noise.mean())) < 0.06
    assert len(bench.episode_returns) == 1  # one Pendulum episode is 200 steps
    # a time limit is no terminal state: every row bootstraps
    assert float(replay.buffers["done"][:250].sum()) == 0.0


def test_the_learner_delays_the_actor_and_moves_the_targets_by_polyak() -> None:
    bench = Bench(mprl_td3.ALGORITHM, workers=1, config=SMALL, seed=4)
    mprl_td3.worker(bench.context(0, steps=300))
    model, target = bench.model, bench.state.target
    before, target_before = params(model), params(target)
    assert all(torch.equal(before[k], target_before[k]) for k in before)  # a copy at the start
    mprl_td3.train(bench.context("trainer", stop_when=lambda ctx: ctx.state.updates.value >= 20))
    after, target_after = params(model), params(target)
    assert bench.state.updates.value == 20
    assert bench.state.weights.version == 10  # the actor published every policy_delay = 2
    for name in before:
        if name.startswith(("actor.", "critic.")):
            assert not torch.equal(after[name], before[name]), name  # both learnt
            # tau = 0.005, 10 times: the targets moved a little of the way, not to the model
            moved = (target_after[name] - target_before[name]).abs().max()
            assert 0 < moved < (after[name] - target_before[name]).abs().max(), name
    records = [r for r in bench.records if "critic_loss" in r]
    assert records and records[-1]["updates"] == 20 and "actor_loss" in records[-1]


def test_with_tau_one_the_targets_are_the_model_after_each_actor_update() -> None:
    bench = Bench(mprl_td3.ALGORITHM, workers=1, config={**SMALL, "tau": 1.0}, seed=5)
    mprl_td3.worker(bench.context(0, steps=200))
    mprl_td3.train(bench.context("trainer", stop_when=lambda ctx: ctx.state.updates.value >= 6))
    model, target = params(bench.model), params(bench.state.target)
    assert all(torch.equal(model[k], target[k]) for k in model)


@pytest.fixture
def one_torch_thread():
    """A serial run computes in the test's process: one thread, as a spawned process has
    (small networks run faster so), and the run repeats exactly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_serial_run_learns_pendulum(mprl_pm, mprl_serial, one_torch_thread) -> None:
    mprl_pm.register(mprl_td3)
    config = {"hidden": [64, 64], "batch_size": 128, "learning_starts": 500, "tau": 0.01}
    result = mprl_serial("td3", workers=1, total_steps=6000, seed=0, config=config)
    returns = result.episode_returns
    assert len(returns) == 30  # 200 steps each: every episode ends by the time limit
    # a random policy scores about -1,200 on Pendulum: the first episodes do; the last do far
    # better (-240 here; -124 with seed 1)
    assert statistics.fmean(returns[:5]) < -900
    assert statistics.fmean(returns[-5:]) > -600, returns
    state = result.state
    # one update per env step after the warm-up (the last step's row as the run stops)
    assert 6000 - 500 - 1 <= state.updates.value <= 6000 - 500
    assert state.weights.version == state.updates.value // 2  # the actor every other update
