"""mprl.lib.nets: Adam (the same updates as torch.optim.Adam, without importing torch._dynamo),
and mprl.lib.envbatch.EnvBatch (episodes, time-limit bootstrap and rollout slots, on real
environments, with a feed-forward and a recurrent model)."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from mprl.lib.envbatch import EnvBatch, rollout_spec
from mprl.lib.nets import ActorCritic, ActorCriticConfig, Adam, make_optimizer
from mprl.lib.recurrent import RecurrentActorCritic


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model(torch.randn(16, 4, generator=gen)).pow(2).sum()


def test_adam_updates_exactly_as_torch_adam():
    ours, theirs = _model(), _model()
    opt = make_optimizer(ours.parameters(), ActorCriticConfig(lr=0.01))
    ref = torch.optim.Adam(theirs.parameters(), lr=0.01, eps=1e-5, fused=True)
    assert isinstance(opt, Adam) and isinstance(opt, torch.optim.Optimizer)
    for step in range(6):
        for model, optimizer in ((ours, opt), (theirs, ref)):
            optimizer.zero_grad()
            _loss(model, step).backward()
            optimizer.step()
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert p.grad is not None and torch.equal(p, q)
    mine, reference = opt.state_dict(), ref.state_dict()
    assert mine["param_groups"] == reference["param_groups"]
    for i, state in reference["state"].items():
        for key, value in state.items():
            assert torch.equal(mine["state"][i][key], value), key
    opt.zero_grad()
    assert all(p.grad is None for p in ours.parameters())  # set_to_none, as torch's default


class EpisodeLog:
    """The part of a Context EnvBatch uses: real time-limited CartPoles, episodes recorded."""

    def __init__(self, limit: int, seed: int = 0) -> None:
        self.limit, self.seed, self.episodes, self.steps = limit, seed, [], 0

    def make_env(self, index: int) -> gym.Env:
        env = gym.make("CartPole-v1", max_episode_steps=self.limit)
        env.reset(seed=self.seed * 100 + index)
        return env

    def log_episode(self, episode_return: float, episode_length: int) -> None:
        self.episodes.append((episode_return, episode_length))

    def add_steps(self, n: int) -> None:
        self.steps += n


def _env_batch(way: str, ctx: EpisodeLog, n: int, gamma: float, seed: int = 0) -> EnvBatch:
    if way == "gym":
        return EnvBatch(ctx, n, gamma)
    pytest.importorskip("envpool")
    from mprl.lib.envpool import make_pool

    seeds = [seed * 100 + i for i in range(n)]
    return EnvBatch(
        ctx, n, gamma, pool=make_pool("CartPole-v1", seeds, max_episode_steps=ctx.limit)
    )


@pytest.mark.parametrize("way", ["gym", "envpool"])
def test_env_batch_rollout_records_episodes_and_bootstraps_time_limits(way):
    """The same either way a worker steps its envs: a Python loop over gymnasium envs, or one
    EnvPool in C++ (``--env-batch envpool``)."""
    limit, n, steps, gamma, value = 12, 3, 60, 0.9, 2.5
    ctx = EpisodeLog(limit)
    envs = _env_batch(way, ctx, n, gamma)
    space = gym.make("CartPole-v1")
    torch.manual_seed(0)
    model = ActorCritic(space.observation_space, space.action_space, (8,))
    with torch.no_grad():  # V(x) = value everywhere: the bootstrap is known
        model.v[-1].weight.zero_()
        model.v[-1].bias.fill_(value)
    slot = {
        name: torch.zeros(shape, dtype=dtype)
        for name, (shape, dtype) in rollout_spec(
            space.observation_space, space.action_space, steps, n
        ).items()
    }
    start = envs.obs.clone()
    envs.rollout(model, slot)

    assert ctx.steps == steps * n
    assert torch.equal(slot["obs"][0], start) and torch.equal(slot["obs"][steps], envs.obs)
    done = slot["done"].bool()
    # CartPole pays 1 a step: an episode's return is its length, which the dones delimit
    lengths = []
    for i in range(n):
        ends = done[:, i].nonzero().flatten().tolist()
        lengths += [b - a for a, b in zip([-1, *ends], ends, strict=False)]
    assert sorted(ctx.episodes) == sorted((float(k), k) for k in lengths)
    assert all(1 <= k <= limit for k in lengths) and limit in lengths  # some hit the limit
    # a step that hit the time limit keeps the value of where it stopped; a fall does not
    reward = slot["reward"][done]
    truncated = torch.isclose(reward, torch.tensor(1 + gamma * value))
    assert truncated.any() and (~truncated).any()  # both kinds of episode end happened
    assert torch.all(truncated | (reward == 1.0))
    assert torch.all(slot["reward"][~done] == 1.0)
    # log-probs are those of the actions taken under the policy
    out = model.policy(slot["obs"][:steps])
    logp, _ = model.log_prob_entropy(out, slot["action"])
    assert torch.allclose(logp, slot["logp"], atol=1e-6)
    # every env that finished was reset within the step: the next observation starts anew
    starts = slot["obs"][1:][done]
    assert torch.all(starts.abs() <= 0.05)  # CartPole starts within 0.05 of upright and still
    envs.close()


class LastObservations(EpisodeLog):
    """EpisodeLog's envs, each keeping the observations its episodes ended on, in order."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.envs: list[RecordEnds] = []

    def make_env(self, index: int) -> gym.Env:
        self.envs.append(RecordEnds(super().make_env(index)))
        return self.envs[-1]


class RecordEnds(gym.Wrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.ends: list[np.ndarray] = []

    def step(self, action):  # type: ignore[no-untyped-def]
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            self.ends.append(obs)
        return obs, reward, terminated, truncated, info


def test_a_recurrent_rollout_bootstraps_a_time_limit_with_the_state_its_env_left():
    """Where a time limit cut an episode, the reward learned from is the env's plus gamma times
    :meth:`EnvBatch.bootstrap`: the value of the episode's last observation with the state that
    env's own step left, as replaying the rollout from its stored start state gives it."""
    limit, n, steps, gamma = 4, 3, 9, 0.9  # CartPole falls later: every end is the time limit
    ctx = LastObservations(limit)
    envs = EnvBatch(ctx, n, gamma)
    space = gym.make("CartPole-v1")
    torch.manual_seed(0)
    model = RecurrentActorCritic(space.observation_space, space.action_space, (8,), "gru", 4)
    config = SimpleNamespace(core="gru", core_size=4)
    spec = rollout_spec(space.observation_space, space.action_space, steps, n, config)
    slot = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in spec.items()}
    envs.rollout(model, slot)
    for env in ctx.envs:
        env.ends = []
    envs.rollout(model, slot)  # this one starts from the states the first left
    assert slot["state"].abs().sum() > 0 and slot["done"].sum() >= n

    state, checked = slot["state"], 0
    with torch.no_grad():
        for t in range(steps):
            _, _, state = model.step(slot["obs"][t], state)  # the state after step t
            for i in slot["done"][t].nonzero().flatten().tolist():
                last = torch.as_tensor(ctx.envs[i].ends.pop(0))[None]
                value = model.step(last, state[:, [i]])[1].item()
                assert slot["reward"][t, i].item() == pytest.approx(1.0 + gamma * value, 1e-6)
                assert value != pytest.approx(model.step(last, model.initial_state(1))[1].item())
                checked += 1
            state = state * (1.0 - slot["done"][t]).unsqueeze(-1)
    assert checked == slot["done"].sum() and slot["reward"][slot["done"] == 0].eq(1.0).all()
    envs.close()


@pytest.mark.parametrize("way", ["gym", "envpool"])
def test_env_batch_repeats_for_a_seed_and_differs_for_another(way):
    def rollout(seed: int) -> torch.Tensor:
        ctx = EpisodeLog(200, seed)
        envs = _env_batch(way, ctx, 2, 0.99, seed)
        space = gym.make("CartPole-v1")
        torch.manual_seed(0)
        model = ActorCritic(space.observation_space, space.action_space, (8,))
        spec = rollout_spec(space.observation_space, space.action_space, 40, 2)
        slot = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in spec.items()}
        envs.rollout(model, slot)
        envs.close()
        return slot["obs"]

    assert torch.equal(rollout(1), rollout(1))
    assert not torch.equal(rollout(1), rollout(2))


def _pendulum_sde(every: int) -> tuple[ActorCritic, torch.Tensor]:
    env = gym.make("Pendulum-v1")
    torch.manual_seed(0)
    model = ActorCritic(env.observation_space, env.action_space, (16, 16), sde_every=every)
    with torch.no_grad():
        model.log_std.normal_(0.0, 0.5)  # not all alike: each feature's own scale
    obs = torch.as_tensor(np.stack([env.observation_space.sample() for _ in range(3)]))
    return model, obs


def test_gsde_noise_is_the_states_features_times_each_envs_matrix_held_for_k_steps():
    """gSDE (``sde_every`` k): an env's exploration noise is its latent features times its
    own exploration matrix, the same matrix for k steps, then a new one."""
    model, obs = _pendulum_sde(every=3)
    with torch.no_grad():
        out = model.policy(obs)
        mean, latent = out[:, :1], out[:, 1:]
        assert latent.shape == (3, 16) and torch.equal(mean, model.pi(obs))
        first = [model.sample(out) for _ in range(3)]
        matrices = model._noise.clone()
        assert all(torch.equal(a, first[0]) for a in first)  # one matrix for 3 steps
        assert not torch.equal(model.sample(out), first[0])  # then a new one
        expected = mean + torch.einsum("bl,bla->ba", latent, matrices)
        assert torch.allclose(first[0], expected, atol=1e-6)
        assert len({round(float(a), 4) for a in first[0] - mean}) == 3  # each env its own
        # another state, the same matrices: noise follows the features
        other = model.policy(obs.flip(0))
        model._noise_age = 0
        model._noise = matrices
        moved = model.sample(other) - other[:, :1]
        assert torch.allclose(moved, torch.einsum("bl,bla->ba", other[:, 1:], matrices), atol=1e-6)


def test_gsde_log_prob_is_a_gaussian_whose_variance_the_features_give():
    model, obs = _pendulum_sde(every=4)
    out = model.policy(obs)
    actions = torch.randn(3, 1)
    logp, entropy = model.log_prob_entropy(out, actions)
    mean, latent = out[:, :1], out[:, 1:]
    std = (latent.pow(2) @ model.log_std.exp().pow(2) + 1e-6).sqrt()
    normal = torch.distributions.Normal(mean, std)
    assert torch.allclose(logp, normal.log_prob(actions).sum(-1), atol=1e-5)
    assert torch.allclose(entropy, normal.entropy().sum(-1), atol=1e-5)
    # the variance is a function of the std matrix alone: the features' own weights get no
    # gradient through it (SB3's gSDE without learn_features), only through the mean
    entropy.sum().backward(retain_graph=True)
    assert model.log_std.grad.abs().sum() > 0 and not model.pi[0].weight.grad.any()
    logp.sum().backward()
    assert model.pi[0].weight.grad.abs().sum() > 0 and model.pi[-1].weight.grad.abs().sum() > 0
    # deterministic play is the mean, clipped to the bounds
    assert torch.equal(
        torch.as_tensor(model.act(obs, deterministic=True)), mean.detach().clamp(-2, 2)
    )


def test_gsde_on_discrete_actions_is_refused_with_the_fix():
    env = gym.make("CartPole-v1")
    from mprl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"config field 'sde_every'.*use --set sde_every=0"):
        ActorCritic(env.observation_space, env.action_space, (8,), sde_every=4)
