"""MAPPO and independent PPO (ippo), built-in multi-agent algorithm plugins (registered through
the ``mprl`` entry point) for PettingZoo parallel envs: ``--env mpe2:simple_spread_v3``.

Synchronous like ppo: every iteration each worker fills its rollout slot with whole-team steps
of its envs, the train process runs clipped PPO on all of them and publishes the new weights.
"""

from __future__ import annotations

import gymnasium as gym

import mprl
from mprl_builtin.mappo.algorithm import (
    SCHEMA,
    AgentsModel,
    IPPOConfig,
    MAPPOConfig,
    make_model,
    make_optimizer,
    train,
    worker,
)

__version__ = "0.1.0"
__all__ = ["ALGORITHMS", "AgentsModel", "IPPOConfig", "MAPPOConfig"]

_COMMON = {
    "make_model": make_model,
    "make_optimizer": make_optimizer,
    "schema": SCHEMA,
    "worker": worker,
    "train": train,
    "agents": "multi",
    "action_spaces": (gym.spaces.MultiDiscrete, gym.spaces.Box),
    "default_env": "mpe2:simple_spread_v3",
}

ALGORITHMS = (
    mprl.Algorithm(
        name="mappo",
        config_cls=MAPPOConfig,
        description="MAPPO: multi-agent PPO, shared actor, centralized critic on the global state",
        **_COMMON,
    ),
    mprl.Algorithm(
        name="ippo",
        config_cls=IPPOConfig,
        description="independent PPO: multi-agent PPO, each agent's critic on its own observation",
        **_COMMON,
    ),
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    for algorithm in ALGORITHMS:
        register(algorithm)
