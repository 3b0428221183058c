"""PPO, a built-in algorithm plugin (registered through the ``mprl`` entry point).

Synchronous actor-learner: every iteration each worker fills its rollout slot
(``schema.Rollouts``) with the current policy, the train process runs clipped PPO with GAE on
all of them, and publishes the new weights (``schema.Weights``); the workers wait for that
version before collecting again. Waiting sleeps; nothing busy-waits.
"""

from __future__ import annotations

import gymnasium as gym

import mprl
from mprl.lib.nets import make_optimizer
from mprl.lib.recurrent import make_model
from mprl_builtin.ppo.algorithm import PRESETS, SCHEMA, PPOConfig, gae, train, worker

__version__ = "0.1.0"
__all__ = ["ALGORITHM", "PPOConfig", "gae"]

ALGORITHM = mprl.Algorithm(
    name="ppo",
    config_cls=PPOConfig,
    make_model=make_model,
    make_optimizer=make_optimizer,
    schema=SCHEMA,
    worker=worker,
    observation_spaces=(gym.spaces.Box,),  # flat vectors (MLP) or images (CNN)
    train=train,
    presets=PRESETS,
    description="PPO: synchronous collecting workers, one clipped-PPO learner with GAE",
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(ALGORITHM)
