"""Tests of the reinforce plugin, written with mprl.testing: in-process serial runs, no spawn."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import attrs
import gymnasium as gym
import mprl_reinforce
import pytest
import torch

import mprl
from mprl.plugins import PluginManager
from mprl.schema import SharedState
from mprl.testing import HookRecorder, SerialResult, registered

Serial = Callable[..., SerialResult]  # the mprl_serial fixture


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_registers_reinforce_for_discrete_action_spaces() -> None:
    algos = registered(mprl_reinforce)
    assert list(algos) == ["reinforce"]
    algo = algos["reinforce"]
    assert algo.config_cls() == mprl_reinforce.Config(
        lr=1e-2, gamma=0.99, hidden=32, baseline_rate=0.05
    )
    assert algo.worker is mprl_reinforce.worker and algo.train is None
    assert algo.make_optimizer is mprl_reinforce.make_optimizer
    assert algo.supports(gym.spaces.Discrete(2))
    assert not algo.supports(gym.spaces.Box(-1.0, 1.0, shape=(1,)))


@pytest.mark.parametrize(
    ("field", "value"),
    [("lr", 0), ("lr", -1e-3), ("gamma", 0), ("gamma", 1.5), ("hidden", 0), ("baseline_rate", 2)],
)
def test_bad_config_values_are_refused_naming_the_field(
    mprl_pm: PluginManager, mprl_serial: Serial, field: str, value: float
) -> None:
    mprl_pm.register(mprl_reinforce)
    message = f"reinforce config: field '{field}': '{field}' must"
    with pytest.raises(mprl.ConfigError, match=message):
        mprl_serial("reinforce", config={field: value})


def test_shared_state_is_built_from_the_schema(mprl_state: Callable[..., SharedState]) -> None:
    state = mprl_state(registered(mprl_reinforce)["reinforce"], workers=3)  # no Manager
    assert list(state.episodes) == [0, 0, 0]
    assert isinstance(state.baseline, torch.Tensor)
    assert state.baseline.shape == (1,) and state.baseline.item() == 0.0
    assert state.baseline.is_shared()


def test_discounted_returns() -> None:
    returns = mprl_reinforce.discounted_returns([1.0, 1.0, 1.0], gamma=0.5)
    assert returns.tolist() == [1.75, 1.5, 1.0]
    assert mprl_reinforce.discounted_returns([0.0, 2.0], gamma=1.0).tolist() == [2.0, 2.0]


def test_play_episode_plays_until_the_episode_ends() -> None:
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    torch.manual_seed(0)
    config = mprl_reinforce.Config()
    model = mprl_reinforce.make_model(env.observation_space, env.action_space, config)
    log_probs, rewards = mprl_reinforce.play_episode(model, env)
    assert 0 < len(rewards) < 500 and set(rewards) == {1.0}
    assert log_probs.shape == (len(rewards),) and log_probs.requires_grad
    assert (log_probs < 0).all()
    env.close()


def test_workers_make_their_envs_through_the_hook(
    mprl_pm: PluginManager, mprl_recorder: HookRecorder, mprl_serial: Serial
) -> None:
    mprl_pm.register(mprl_reinforce)
    result = mprl_serial("reinforce", workers=2, total_steps=200)
    (register,) = mprl_recorder.of("mprl_register_algorithms")
    assert "mprl_reinforce" in register.plugins
    # one env in the main process to check the id and spaces, then one per worker once started
    names = mprl_recorder.names()
    env_at = [i for i, name in enumerate(names) if name == "mprl_make_env"]
    assert env_at[0] < names.index("mprl_run_start") < env_at[1] and names[-1] == "mprl_run_end"
    calls = mprl_recorder.of("mprl_make_env")
    assert [c.kwargs["rank"] for c in calls] == [-1, 0, 1]
    workers = {c.rank: c for c in result.contexts}
    assert all(c.kwargs["seed"] == workers[c.kwargs["rank"]].env_seed(0) for c in calls[1:])
    assert calls[1].kwargs["seed"] != calls[2].kwargs["seed"]


# a copy of reinforce whose make_model keeps the initial weights, for the test to compare
INITIAL: list[torch.Tensor] = []


def make_model_keeping_initial(
    obs_space: gym.Space, act_space: gym.Space, config: mprl_reinforce.Config
) -> torch.nn.Module:
    model = mprl_reinforce.make_model(obs_space, act_space, config)
    INITIAL[:] = params(model)
    return model


class KeepInitial:
    @mprl.hookimpl
    def mprl_register_algorithms(self, register: Callable[[mprl.Algorithm], None]) -> None:
        algo = registered(mprl_reinforce)["reinforce"]
        register(attrs.evolve(algo, name="reinforce-probe", make_model=make_model_keeping_initial))


def test_a_serial_run_trains_the_shared_model(mprl_pm: PluginManager, mprl_serial: Serial) -> None:
    mprl_pm.register(KeepInitial())
    result = mprl_serial("reinforce-probe", workers=2, total_steps=2000, seed=0)
    summary = result.summary
    assert summary.status == "finished" and summary.stop_reason == "total steps reached"
    assert summary.env_steps >= 2000 and min(summary.per_worker_steps) > 0
    # each worker counted its episodes in its own slot of the shared list
    episodes = [r for r in result.records if "episode_return" in r]
    by_worker = [sum(r["source"] == f"worker:{rank}" for r in episodes) for rank in (0, 1)]
    assert list(result.state.episodes) == by_worker and min(by_worker) > 5
    assert sum(result.state.episodes) == summary.episodes == len(result.episode_returns)
    assert all(r["loss"] == r["loss"] for r in episodes)  # logged with each episode, not NaN
    # the shared optimizer stepped the shared model
    assert INITIAL and not any(
        torch.equal(a, b) for a, b in zip(INITIAL, params(result.model), strict=True)
    )
    # the baseline is the running mean of every episode's returns, whichever worker played it
    # (CartPole pays 1 per step, so an episode's length gives its returns)
    expected = 0.0
    for record in episodes:
        returns = mprl_reinforce.discounted_returns([1.0] * record["episode_length"], 0.99)
        expected += 0.05 * (returns.mean().item() - expected)
    assert result.state.baseline.item() == pytest.approx(expected, rel=1e-4)
    assert expected > 10


def test_a_serial_run_repeats_exactly_for_a_seed(
    mprl_pm: PluginManager, mprl_serial: Serial
) -> None:
    mprl_pm.register(mprl_reinforce)
    a, b, c = (mprl_serial("reinforce", workers=2, total_steps=1000, seed=s) for s in (7, 7, 8))
    assert len(a.episode_returns) > 10
    assert a.episode_returns == b.episode_returns
    assert all(torch.equal(x, y) for x, y in zip(params(a.model), params(b.model), strict=True))
    assert torch.equal(a.state.baseline, b.state.baseline)
    assert a.episode_returns != c.episode_returns
    assert not torch.equal(params(a.model)[0], params(c.model)[0])


def test_it_learns_cartpole(mprl_pm: PluginManager, mprl_serial: Serial) -> None:
    mprl_pm.register(mprl_reinforce)
    returns = mprl_serial("reinforce", workers=2, total_steps=4000, seed=0).episode_returns
    first, last = statistics.mean(returns[:10]), statistics.mean(returns[-10:])
    assert first < 30 and last > 3 * first
