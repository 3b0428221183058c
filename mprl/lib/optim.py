"""Optimizers for algorithm plugins: an Adam that builds and steps without ``torch._dynamo``
(:class:`Adam`, :func:`make_optimizer`) and a learning rate annealed over env steps
(:func:`annealed_lr`)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from mprl.lib.configs import MIN_LR_FRACTION, ActorCriticConfig


def annealed_lr(config: Any, env_steps: int) -> float:
    """``config.lr``, falling linearly over ``config.anneal_steps`` env steps to
    :data:`MIN_LR_FRACTION` of itself (constant where that is 0 or not a field)."""
    steps = getattr(config, "anneal_steps", 0)
    if not steps:
        return config.lr
    return config.lr * max(MIN_LR_FRACTION, 1.0 - env_steps / steps)


_ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)
_ZERO_GRAD = inspect.unwrap(torch.optim.Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.load_state_dict)
_ADD_PARAM_GROUP = inspect.unwrap(torch.optim.Optimizer.add_param_group)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` without torch.optim's ``torch.compile`` wrappers around ``step``,
    ``zero_grad``, ``add_param_group`` (which the constructor calls), ``state_dict`` and
    ``load_state_dict``.

    Those wrappers import ``torch._dynamo`` the first time they run: a second of CPU in every
    process that touches the optimizer (the main process that builds it, each a3c worker, every
    learner), paid at its start-up and on two cores straight off the time to solve. The
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

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)


def make_optimizer(
    params: Iterable[nn.Parameter], config: ActorCriticConfig
) -> torch.optim.Optimizer:
    """:class:`Adam` with ``config.lr`` (an ``Algorithm.make_optimizer``); the fused kernel where
    this torch has it on the CPU (why: see benchmarks/README.md, "Fused Adam")."""
    params = list(params)
    try:
        return Adam(params, lr=config.lr, eps=1e-5, fused=True)
    except RuntimeError:  # torch < 2.4: no fused Adam on CPU
        return Adam(params, lr=config.lr, eps=1e-5)
