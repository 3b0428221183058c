"""SAC, a built-in algorithm plugin (registered through the ``mprl`` entry point).

Off-policy, for continuous (Box) actions: workers act with the newest published policy
(``schema.Weights``) and add every transition to a replay buffer (``schema.ReplayBuffer``); one
train process samples it and updates twin Q networks, their target copies (``schema.Module``,
checkpointed), a tanh-squashed Gaussian policy and the entropy coefficient, each with its own
named optimizer. The replay ratio is declared on the buffer, and the backend keeps it; the parts
are ``mprl.lib.continuous``'s.
"""

from __future__ import annotations

import gymnasium as gym

import mprl
from mprl_builtin.sac.algorithm import (
    PRESETS,
    SCHEMA,
    SACConfig,
    SACModel,
    actor_optimizer,
    alpha_optimizer,
    critic_optimizer,
    make_model,
    train,
    worker,
)

__version__ = "0.1.0"
__all__ = ["ALGORITHM", "SACConfig", "SACModel"]

ALGORITHM = mprl.Algorithm(
    name="sac",
    config_cls=SACConfig,
    make_model=make_model,
    optimizers={"actor": actor_optimizer, "critic": critic_optimizer, "alpha": alpha_optimizer},
    schema=SCHEMA,
    worker=worker,
    train=train,
    action_spaces=(gym.spaces.Box,),  # continuous actions only: a Discrete env is refused
    observation_spaces=(gym.spaces.Box,),  # flat vectors: the networks are MLPs
    default_env="Pendulum-v1",
    presets=PRESETS,
    description="SAC: workers fill a replay buffer, one soft actor-critic learner (Box actions)",
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(ALGORITHM)
