"""IMPALA, a built-in algorithm plugin (registered through the ``mprl`` entry point).

The actor-learner shape of the classic multi-process main: workers only collect experience,
one train process learns. Rollouts travel through rollout slots (``schema.Rollouts``), weights
come back through ``schema.Weights``, and V-trace corrects for the policy lag.
"""

from __future__ import annotations

import gymnasium as gym

import mprl
from mprl.lib.nets import make_optimizer
from mprl.lib.recurrent import make_model
from mprl_builtin.impala.algorithm import (
    PRESETS,
    SCHEMA,
    ImpalaConfig,
    train,
    worker,
)

__version__ = "0.1.0"

ALGORITHM = mprl.Algorithm(
    name="impala",
    config_cls=ImpalaConfig,
    make_model=make_model,
    make_optimizer=make_optimizer,
    schema=SCHEMA,
    worker=worker,
    observation_spaces=(gym.spaces.Box,),  # flat vectors (MLP) or images (CNN)
    train=train,
    presets=PRESETS,
    description="IMPALA: collecting workers, one V-trace learner, rollout slots",
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(ALGORITHM)
