"""Actor-critic networks for Discrete (categorical) and Box (diagonal Gaussian) action spaces,
their config, and an Adam for shared use: for algorithm plugins to build on (the built-in a3c,
impala and ppo use them)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch
from attrs import validators as v
from torch import nn


def mlp(n_in: int, hidden: tuple[int, ...], n_out: int, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        linear = nn.Linear(n_in, h)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear, nn.Tanh()]
        n_in = h
    head = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(head.weight, out_gain)
    nn.init.zeros_(head.bias)
    layers.append(head)
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate policy and value networks; ``dist_params`` gives logits or (mean, log_std)."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: tuple[int, ...]) -> None:
        super().__init__()
        n_obs = int(np.prod(obs_space.shape))
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        n_act = int(act_space.n) if self.discrete else int(np.prod(act_space.shape))
        self.pi = mlp(n_obs, hidden, n_act, 0.01)
        self.v = mlp(n_obs, hidden, 1, 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(n_act))
            self.register_buffer("low", torch.as_tensor(act_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(act_space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pi(obs), self.v(obs).squeeze(-1)

    def sample(self, out: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return torch.multinomial(torch.softmax(out, -1), 1).squeeze(-1)
        return out + self.log_std.exp() * torch.randn_like(out)

    def log_prob_entropy(
        self, out: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.discrete:
            logp = torch.log_softmax(out, -1)
            chosen = logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return chosen, -(logp.exp() * logp).sum(-1)
        log_std = self.log_std.expand_as(out)
        z = (actions - out) / log_std.exp()
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)
        return logp, entropy

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations, as the env takes them: sampled, or the most
        likely (argmax / the Gaussian's mean) when ``deterministic``. ``mprl eval`` uses it."""
        with torch.no_grad():
            out = self.pi(obs)
            if not deterministic:
                actions = self.sample(out)
            else:
                actions = out.argmax(-1) if self.discrete else out
        return self.to_env(actions)

    def to_env(self, actions: torch.Tensor) -> np.ndarray:
        """Actions as the env takes them (Box actions clipped to the bounds)."""
        if self.discrete:
            return actions.numpy()
        return torch.max(torch.min(actions, self.high), self.low).numpy()


def field_help(text: str) -> dict[str, str]:
    """``metadata`` for an attrs config field: ``text`` becomes its ``--help`` line."""
    return {"help": text}


@attrs.frozen
class ActorCriticConfig:
    """Hyperparameters every actor-critic plugin here has; subclass it (``@attrs.frozen``) to add
    an algorithm's own fields or change a default."""

    envs_per_worker: int = attrs.field(
        default=8, validator=v.ge(1), metadata=field_help("environments each worker steps together")
    )
    gamma: float = attrs.field(
        default=0.99, validator=[v.gt(0.0), v.le(1.0)], metadata=field_help("discount factor")
    )
    lr: float = attrs.field(
        default=1e-3, validator=v.gt(0.0), metadata=field_help("Adam learning rate")
    )
    entropy_coef: float = attrs.field(
        default=0.01, validator=v.ge(0.0), metadata=field_help("weight of the entropy bonus")
    )
    value_coef: float = attrs.field(
        default=0.5, validator=v.ge(0.0), metadata=field_help("weight of the value loss")
    )
    max_grad_norm: float = attrs.field(
        default=0.5, validator=v.gt(0.0), metadata=field_help("gradient norm clip per update")
    )
    normalize_advantages: bool = attrs.field(
        default=True, metadata=field_help("normalise advantages within each update")
    )
    hidden: tuple[int, ...] = attrs.field(
        default=(64, 64),
        converter=tuple,
        validator=v.deep_iterable(v.and_(v.instance_of(int), v.gt(0))),
        metadata=field_help("hidden layer sizes of the policy and value networks"),
    )


def make_model(obs_space: gym.Space, act_space: gym.Space, config: ActorCriticConfig) -> nn.Module:
    """An :class:`ActorCritic` with ``config.hidden`` layers (an ``Algorithm.make_model``)."""
    return ActorCritic(obs_space, act_space, config.hidden)


_ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)
_ZERO_GRAD = inspect.unwrap(torch.optim.Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.load_state_dict)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` without torch.optim's ``torch.compile`` wrappers around ``step``,
    ``zero_grad``, ``state_dict`` and ``load_state_dict``.

    Those wrappers import ``torch._dynamo`` the first time they run: a second of CPU in every
    process that touches the optimizer (each a3c worker, every learner, the main process of a
    resumed run), paid at its start-up and on two cores straight off the time to solve. The
    update is Adam's own code, unchanged (``inspect.unwrap`` reaches it; with a torch that does
    not wrap, nothing changes). Do not ``torch.compile`` a step of this optimizer; use
    ``torch.optim.Adam`` for that.
    """

    #: :attr:`mprl.Context.optimizer` does not import ``torch._dynamo`` ahead for it
    needs_dynamo = False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        return _ADAM_STEP(self, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)


def make_optimizer(
    params: Iterable[nn.Parameter], config: ActorCriticConfig
) -> torch.optim.Optimizer:
    """:class:`Adam` with ``config.lr`` (an ``Algorithm.make_optimizer``); the fused kernel, a
    third faster per step than the default on CPU, where this torch has it."""
    params = list(params)
    try:
        return Adam(params, lr=config.lr, eps=1e-5, fused=True)
    except RuntimeError:  # torch < 2.4: no fused Adam on CPU
        return Adam(params, lr=config.lr, eps=1e-5)
