"""REINFORCE with a running-mean baseline, as a third-party mprl plugin.

Each worker plays whole episodes with the shared policy and applies its policy gradient to the
shared model through the shared optimizer (Hogwild). The per-worker episode counts and the
baseline live in the plugin's shared-state schema.
"""

from __future__ import annotations

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
    lr: float = attrs.field(default=1e-2, validator=v.gt(0), metadata={"help": "Adam step size"})
    gamma: float = attrs.field(
        default=0.99, validator=v.and_(v.gt(0), v.le(1)), metadata={"help": "discount"}
    )
    hidden: int = attrs.field(default=32, validator=v.ge(1), metadata={"help": "hidden units"})


SCHEMA = schema.Schema(
    episodes=schema.PerWorker(0),  # per-worker episode counts (Manager list)
    baseline=schema.Tensor(shape=(1,)),  # running mean return (shared memory)
)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: Config) -> nn.Module:
    n_obs = int(np.prod(obs_space.shape))
    return nn.Sequential(
        nn.Linear(n_obs, config.hidden), nn.Tanh(), nn.Linear(config.hidden, act_space.n)
    )


def make_optimizer(params, config: Config) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=config.lr)


def worker(ctx: mprl.Context) -> None:
    env = ctx.make_env()
    cfg: Config = ctx.config
    while not ctx.should_stop():
        obs, _ = env.reset()
        log_probs, rewards, done = [], [], False
        while not done:
            logits = ctx.model(torch.as_tensor(obs, dtype=torch.float32))
            dist = torch.distributions.Categorical(logits=logits)
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            obs, reward, terminated, truncated, _ = env.step(action.item())
            rewards.append(float(reward))
            done = terminated or truncated
        ctx.add_steps(len(rewards))
        ctx.log_episode(sum(rewards), len(rewards))
        ctx.state.episodes[ctx.rank] += 1

        returns, running = [], 0.0
        for r in reversed(rewards):
            running = r + cfg.gamma * running
            returns.append(running)
        returns_t = torch.tensor(returns[::-1])
        baseline = ctx.state.baseline
        advantage = returns_t - baseline
        baseline += 0.05 * (returns_t.mean() - baseline)  # shared running mean, Hogwild
        loss = -(torch.stack(log_probs) * advantage).mean()
        ctx.optimizer.zero_grad()
        loss.backward()
        ctx.optimizer.step()


@mprl.hookimpl
def mprl_register_algorithms(register):
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
