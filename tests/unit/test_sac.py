"""The sac plugin: its policy (the act contract, squashing into the bounds), real serial runs
that learn Pendulum and repeat for a seed, a spawned run resumed with its target critic,
counters, optimizers and replay buffer, and the Discrete action spaces it refuses."""

from __future__ import annotations

import contextlib

import gymnasium as gym
import numpy as np
import pytest
import torch

from mprl.errors import UsageError
from mprl.testing import SerialResult, run_serial
from mprl_builtin import sac
from mprl_builtin.sac import SACConfig
from mprl_builtin.sac.algorithm import make_model
from tests.conftest import cli_here

TINY = {"hidden": [32, 32], "batch_size": 64, "learning_starts": 300, "buffer_size": 5000}


@contextlib.contextmanager
def one_torch_thread():
    """A serial run computes in this process: one thread, as each spawned child would have."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def sac_serial(**kw) -> SerialResult:
    with one_torch_thread():
        return run_serial("sac", plugins=[sac], env="Pendulum-v1", **kw)


def test_the_policy_plays_squashed_actions_inside_the_bounds():
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    low, high = np.array([[-3.0, 0.0]] * 2, np.float32), np.array([[1.0, 10.0]] * 2, np.float32)
    act_space = gym.spaces.Box(low, high, dtype=np.float32)
    model = make_model(obs_space, act_space, SACConfig(hidden=(16,)))
    obs = torch.randn(64, 5) * 100  # far outside: the Gaussian saturates the squashing
    for deterministic in (False, True):
        actions = model.act(obs, deterministic)
        assert isinstance(actions, np.ndarray) and actions.shape == (64, 2, 2)
        assert (actions >= act_space.low).all() and (actions <= act_space.high).all()
    # deterministic: tanh(mean), scaled to the bounds; and the same every time
    with torch.no_grad():
        mean = model.actor.mu(torch.relu(model.actor.body(obs)))
    low, high = act_space.low.reshape(-1), act_space.high.reshape(-1)
    expected = low + (high - low) * (torch.tanh(mean).numpy() + 1) / 2
    assert np.allclose(model.act(obs, True), expected.reshape(64, 2, 2), atol=1e-5)
    assert np.array_equal(model.act(obs, True), model.act(obs, True))
    assert not np.array_equal(model.act(obs, False), model.act(obs, False))
    # the log-probability of a squashed sample: the Gaussian's, less log |d tanh|
    squashed, logp = model.actor(obs[:4] / 100, generator=torch.Generator().manual_seed(1))
    noise = torch.randn((4, 4), generator=torch.Generator().manual_seed(1))
    latent = torch.relu(model.actor.body(obs[:4] / 100))
    mu, log_std = model.actor.mu(latent), model.actor.log_std(latent).clamp(-20, 2)
    u = mu + log_std.exp() * noise
    gauss = torch.distributions.Normal(mu, log_std.exp()).log_prob(u)
    assert torch.allclose(squashed, torch.tanh(u), atol=1e-6)
    assert torch.allclose(logp, (gauss - torch.log(1 - torch.tanh(u) ** 2)).sum(-1), atol=1e-3)


def test_unbounded_actions_and_bad_values_are_refused():
    box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    with pytest.raises(UsageError, match="must be finite"):
        make_model(box, box, SACConfig())
    with pytest.raises(ValueError, match="'ent_coef' must be 'auto' or a number >= 0"):
        SACConfig(ent_coef=-0.1)
    with pytest.raises(ValueError, match="hidden"):
        SACConfig(hidden=())
    assert SACConfig(ent_coef=0.2).ent_coef == 0.2


def test_a_discrete_env_is_refused_naming_what_sac_takes(capsys):
    code, err = cli_here(capsys, "run", "--plugin", "sac", "--env", "CartPole-v1")
    assert code == 2
    assert (
        "algorithm 'sac' does not support the action space of 'CartPole-v1' (Discrete); "
        "it supports: Box" in err
    )
    code, err = cli_here(capsys, "run", "--plugin", "sac", "--set", "ent_coef=-1")
    assert code == 2 and "field 'ent_coef'" in err


def test_a_serial_run_repeats_exactly_for_a_seed():
    config = {**TINY, "learning_starts": 400}  # (then about 200 updates: each a repeat too)
    runs = [sac_serial(total_steps=600, workers=2, seed=seed, config=config) for seed in (4, 4, 5)]
    a, b, other = runs
    assert len(a.episode_returns) == 2 and a.episode_returns == b.episode_returns
    assert a.episode_returns != other.episode_returns
    for name, tensor in a.model.state_dict().items():
        assert torch.equal(tensor, b.model.state_dict()[name]), name
    assert a.state.updates.value == b.state.updates.value > 0
    fixed = sac_serial(total_steps=400, seed=4, config={**TINY, "learning_starts": 200,
                                                        "ent_coef": 0.05})  # fmt: skip
    alphas = [r["alpha"] for r in fixed.records if "alpha" in r]
    assert alphas and all(alpha == pytest.approx(0.05) for alpha in alphas)  # not tuned


def test_a_checkpoint_of_sac_before_its_declared_replay_ratio_resumes_at_the_ratio(tmp_path):
    """sac kept its replay ratio by hand before 0.2.0 declared it on the buffer: its
    checkpoints count no rows sampled. Resumed, the learner carries on level with the rows it
    has, one update per new env step, not with a burst of one update for every row."""
    config = {**TINY, "learning_starts": 100}
    first = sac_serial(total_steps=600, seed=2, config=config, run_dir=tmp_path / "a")
    done = first.state.updates.value
    assert 600 - 100 - SACConfig().max_lead <= done <= 500
    path = tmp_path / "a" / "checkpoints" / "last.pt"
    saved = torch.load(path, weights_only=True)
    saved["shared_state"]["replay"]["sampled"] = torch.tensor(0)  # as sac saved it then
    torch.save(saved, path)
    more = sac_serial(total_steps=800, resume=tmp_path / "a", run_dir=tmp_path / "b")
    assert more.summary.status == "finished" and more.summary.env_steps >= 800
    # one update per new step at most: no burst of ~500 (one per row the checkpoint holds)
    assert done < more.state.updates.value <= done + more.summary.env_steps - 600
