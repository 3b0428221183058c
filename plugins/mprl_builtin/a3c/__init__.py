"""A3C, mprl's first built-in algorithm plugin (registered through the ``mprl`` entry point).

Hogwild asynchronous advantage actor-critic: every worker keeps a local copy of the shared model,
collects ``n_steps`` from ``envs_per_worker`` environments with one batched forward per step,
computes n-step returns, and applies its gradients to the shared model through a shared Adam.
"""

from __future__ import annotations

import gymnasium as gym

import mprl
from mprl.lib.nets import make_model, make_optimizer
from mprl_builtin.a3c.algorithm import PRESETS, A3CConfig, worker

__version__ = "0.1.0"

ALGORITHM = mprl.Algorithm(
    name="a3c",
    config_cls=A3CConfig,
    make_model=make_model,
    make_optimizer=make_optimizer,
    worker=worker,
    observation_spaces=(gym.spaces.Box,),  # flat vectors (MLP) or images (CNN)
    presets=PRESETS,
    description="Hogwild A3C: n-step actor-critic, shared model and shared Adam",
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(ALGORITHM)
