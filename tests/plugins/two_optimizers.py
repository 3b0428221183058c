"""A plugin with two named optimizers over parts of one shared model (the classic program's
policy and auxiliary optimizers), for tests/unit/test_optimizers.py and
tests/integration/test_optimizers.py."""

from __future__ import annotations

import attrs
import gymnasium as gym
import torch
from torch import nn

import mprl


@attrs.frozen
class Config:
    lr: float = 1e-3
    aux_lr: float = 0.05


class TwoParts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.policy, self.aux = nn.Linear(4, 2), nn.Linear(4, 1)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: Config) -> nn.Module:
    return TwoParts()


def policy_optimizer(model: TwoParts, config: Config) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.policy.parameters(), lr=config.lr)


def aux_optimizer(model: TwoParts, config: Config) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.aux.parameters(), lr=config.aux_lr, momentum=0.9)


def worker(ctx: mprl.Context) -> None:
    env = ctx.make_env()
    env.reset()
    length = 0
    while not ctx.should_stop():
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        ctx.add_steps(1)
        length += 1
        if terminated or truncated:
            ctx.log_episode(float(length), length)
            env.reset()
            length = 0


def train(ctx: mprl.Context) -> None:
    policy, aux = ctx.optimizers["policy"], ctx.optimizers["aux"]
    assert ctx.optimizer is None  # two of them: by name only
    first = True
    while not ctx.should_stop():
        obs = torch.randn(8, 4)
        loss = ctx.model.policy(obs).pow(2).mean() + ctx.model.aux(obs).pow(2).mean()
        policy.zero_grad()
        aux.zero_grad()
        loss.backward()
        policy.step()
        aux.step()
        if first:  # where Adam's step count starts in this session
            ctx.log(adam_step=int(policy.state[ctx.model.policy.weight]["step"]))
            first = False


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="two-optimizers", config_cls=Config, make_model=make_model, worker=worker,
            train=train, optimizers={"policy": policy_optimizer, "aux": aux_optimizer},
        )
    )  # fmt: skip
