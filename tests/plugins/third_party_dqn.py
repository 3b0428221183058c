"""A third-party plugin named like a built-in: distribution ``mprl-dqn``, plugin ``dqn``, module
``mprl_dqn`` (the pattern docs/first-plugin.md gives authors). The tests install this file under
that module name (tests/conftest.py, ``third_party_dqn``), beside mprl's own ``dqn``.

Its algorithm, also ``dqn``, is none of the built-in's: its config has a field of its own
(``anneal_steps``) and its worker logs ``third_party_steps``, so a run shows whose code ran.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

import mprl


@attrs.frozen
class Config:
    anneal_steps: int = attrs.field(default=100, metadata={"help": "not the built-in's field"})


class Policy(torch.nn.Module):
    def __init__(self, n_obs: int, n_actions: int) -> None:
        super().__init__()
        self.q = torch.nn.Linear(n_obs, n_actions)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        return self.q(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()


def make_model(obs_space, act_space, config: Config) -> torch.nn.Module:
    return Policy(obs_space.shape[0], act_space.n)


def worker(ctx: mprl.Context) -> None:
    env = ctx.make_env()
    obs, _ = env.reset()
    ret, length, steps = 0.0, 0, 0
    while not ctx.should_stop():
        with torch.no_grad():
            action = int(ctx.model.act(obs[None])[0])
        obs, reward, terminated, truncated, _ = env.step(action)
        ctx.add_steps(1)
        ret, length, steps = ret + float(reward), length + 1, steps + 1
        if terminated or truncated:
            ctx.log_episode(ret, length)
            ctx.log(third_party_steps=steps)
            obs, _ = env.reset()
            ret, length = 0.0, 0


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="dqn", config_cls=Config, make_model=make_model, worker=worker,
            description="a third party's dqn",
        )
    )  # fmt: skip
