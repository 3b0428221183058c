"""VDN and QMIX, built-in multi-agent algorithm plugins (registered through the ``mprl`` entry
point): value decomposition, off-policy, for cooperative PettingZoo parallel envs with discrete
actions (``--env mpe2:simple_spread_v3``).

Workers act epsilon-greedily per agent with one shared Q network and fill a replay buffer of
team transitions at a declared replay ratio; one train process regresses the mixed ``Q_tot``
(VDN: the sum of the agents' Q values; QMIX: a monotonic mixing network over the global state)
on the target networks' TD target. See :mod:`mprl_builtin.qmix.algorithm`.
"""

from __future__ import annotations

import gymnasium as gym

import mprl
from mprl_builtin.qmix.algorithm import (
    SCHEMA,
    AgentsQ,
    QMIXConfig,
    VDNConfig,
    make_model,
    make_optimizer,
    train,
    worker,
)
from mprl_builtin.qmix.mixers import QMixer, VDNMixer

__version__ = "0.1.0"
__all__ = ["ALGORITHMS", "AgentsQ", "QMIXConfig", "QMixer", "VDNConfig", "VDNMixer"]

_COMMON = {
    "make_model": make_model,
    "make_optimizer": make_optimizer,
    "schema": SCHEMA,
    "worker": worker,
    "train": train,
    "agents": "multi",
    "action_spaces": (gym.spaces.MultiDiscrete,),
    "default_env": "mpe2:simple_spread_v3",
}

ALGORITHMS = (
    mprl.Algorithm(
        name="vdn",
        config_cls=VDNConfig,
        description="VDN: off-policy value decomposition, the team's Q the sum of the agents'",
        **_COMMON,
    ),
    mprl.Algorithm(
        name="qmix",
        config_cls=QMIXConfig,
        description="QMIX: off-policy value decomposition, a monotonic mixer over the global state",
        **_COMMON,
    ),
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    for algorithm in ALGORITHMS:
        register(algorithm)
