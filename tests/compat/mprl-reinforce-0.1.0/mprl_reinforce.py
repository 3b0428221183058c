"""REINFORCE with a running-mean baseline, as a third-party mprl plugin.

Each worker plays whole episodes with the shared policy and applies its policy gradient to the
shared model through the shared optimizer (Hogwild). The per-worker episode counts and the
baseline live in the plugin's shared-state schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs
import gymnasium as gym
import numpy as np
import torch
from attrs import validators as v
from torch import nn

import mprl
from mprl import schema

__version__ = "0.1.0"


@attrs.frozen
class Config:
    """The algorithm's settings; users change them with ``--set lr=0.005`` or a TOML file."""

    lr: float = attrs.field(default=1e-2, validator=v.gt(0), metadata={"help": "Adam step size"})
    gamma: float = attrs.field(
        default=0.99, validator=v.and_(v.gt(0), v.le(1)), metadata={"help": "discount"}
    )
    hidden: int = attrs.field(default=32, validator=v.ge(1), metadata={"help": "hidden units"})
    baseline_rate: float = attrs.field(
        default=0.05,
        validator=v.and_(v.gt(0), v.le(1)),
        metadata={"help": "how fast the baseline follows the mean return"},
    )


SCHEMA = schema.Schema(
    episodes=schema.PerWorker(0),  # per-worker episode counts (Manager list)
    baseline=schema.Tensor(shape=(1,)),  # running mean return (shared memory)
)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: Config) -> nn.Module:
    """The policy: observation in, one logit per action out."""
    n_obs = int(np.prod(obs_space.shape))
    return nn.Sequential(
        nn.Linear(n_obs, config.hidden), nn.Tanh(), nn.Linear(config.hidden, act_space.n)
    )


def make_optimizer(params: Iterable[nn.Parameter], config: Config) -> torch.optim.Optimizer:
    """One optimizer for all workers: its state lives in shared memory too."""
    return torch.optim.Adam(params, lr=config.lr)


def discounted_returns(rewards: list[float], gamma: float) -> torch.Tensor:
    """The return from each step on: ``G[t] = rewards[t] + gamma * G[t + 1]``."""
    returns, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        returns.append(running)
    return torch.tensor(returns[::-1])


def play_episode(model: nn.Module, env: gym.Env) -> tuple[torch.Tensor, list[float]]:
    """One whole episode with the policy ``model``: its actions' log-probabilities, its rewards."""
    obs, _ = env.reset()
    log_probs, rewards, done = [], [], False
    while not done:
        logits = model(torch.as_tensor(obs, dtype=torch.float32))
        dist = torch.distributions.Categorical(logits=logits)
        action = dist.sample()
        log_probs.append(dist.log_prob(action))
        obs, reward, terminated, truncated, _ = env.step(action.item())
        rewards.append(float(reward))
        done = terminated or truncated
    return torch.stack(log_probs), rewards


def worker(ctx: mprl.Context) -> None:
    """Run in each worker process: play an episode, take a gradient step, report; repeat."""
    env = ctx.make_env()
    cfg: Config = ctx.config
    optimizer = ctx.optimizer  # its first use is start-up work: get it before the first episode
    assert optimizer is not None
    baseline = ctx.state.baseline
    while not ctx.should_stop():
        log_probs, rewards = play_episode(ctx.model, env)
        returns = discounted_returns(rewards, cfg.gamma)
        advantage = returns - baseline
        baseline += cfg.baseline_rate * (returns.mean() - baseline)  # shared, Hogwild
        loss = -(log_probs * advantage).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # Only now report: with --serial, each ctx call below may let another worker step the
        # shared model, which would invalidate a graph that backward() has not used yet.
        ctx.add_steps(len(rewards))
        ctx.log_episode(sum(rewards), len(rewards), loss=loss.item())
        ctx.state.episodes[ctx.rank] += 1


@mprl.hookimpl
def mprl_register_algorithms(register: Callable[[mprl.Algorithm], None]) -> None:
    """Tell mprl about the algorithm; the `mprl` entry point names this module."""
    register(
        mprl.Algorithm(
            name="reinforce",
            config_cls=Config,
            make_model=make_model,
            make_optimizer=make_optimizer,
            worker=worker,
            schema=SCHEMA,
            action_spaces=(gym.spaces.Discrete,),
            description="REINFORCE with a shared running-mean baseline (example plugin)",
        )
    )
