"""Several named optimizers over parts of one shared model (the classic program's policy and
auxiliary optimizers): shared, checkpointed, restored on resume, reachable by name."""

from __future__ import annotations

import json
import sys

import attrs
import gymnasium as gym
import torch
from torch import nn

import mprl
from mprl.host.checkpoint import load
from mprl.testing import plugin_manager


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


def test_two_named_optimizers_are_shared_checkpointed_and_resumed(tmp_path):
    pm = plugin_manager(sys.modules[__name__])
    run_dir = tmp_path / "run"
    common = {"plugins": pm, "backend": "serial", "progress": "none", "workers": 1}
    first = mprl.run("two-optimizers", run_dir=run_dir, total_steps=300, **common)
    _, saved = load(run_dir)
    assert set(saved["optimizers"]) == {"policy", "aux"} and saved["optimizer"] is None
    steps = int(saved["optimizers"]["policy"]["state"][0]["step"])
    assert steps > 10  # the learner stepped the shared Adam this often
    assert "momentum_buffer" in saved["optimizers"]["aux"]["state"][0]
    assert saved["optimizers"]["aux"]["param_groups"][0]["lr"] == 0.05  # its own settings
    again = mprl.run(resume=run_dir, total_steps=600, **common)
    assert again.session == 1 and again.env_steps >= 600 > first.env_steps
    _, after = load(run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = [r["adam_step"] for r in records if "adam_step" in r]
    assert starts == [1, steps + 1]  # the resumed Adam counted on from its checkpoint
    assert int(after["optimizers"]["policy"]["state"][0]["step"]) > steps
