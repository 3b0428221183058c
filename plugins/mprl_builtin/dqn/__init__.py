"""DQN, a built-in algorithm plugin (registered through the ``mprl`` entry point).

Off-policy, for Discrete actions and flat observations: workers act epsilon-greedily over a
batch of environments and fill a replay buffer (``schema.ReplayBuffer`` with a declared replay
ratio, which the backend enforces); one train process runs double DQN with a target network
(``schema.Module``, checkpointed) and optional n-step returns, publishing its Q network
(``schema.Weights``). The defaults are rl-zoo's CartPole-v1 settings.
"""

from __future__ import annotations

import gymnasium as gym

import mprl
from mprl_builtin.dqn.algorithm import (
    SCHEMA,
    DQNConfig,
    QNetwork,
    make_model,
    make_optimizer,
    train,
    worker,
)

__version__ = "0.1.0"
__all__ = ["ALGORITHM", "DQNConfig", "QNetwork"]

ALGORITHM = mprl.Algorithm(
    name="dqn",
    config_cls=DQNConfig,
    make_model=make_model,
    make_optimizer=make_optimizer,
    schema=SCHEMA,
    worker=worker,
    train=train,
    action_spaces=(gym.spaces.Discrete,),
    observation_spaces=(gym.spaces.Box,),  # flat vectors: the network is an MLP
    description="DQN: workers fill a replay buffer at a declared ratio, one double-DQN learner",
    # epsilon-greedy training returns lag a greedy policy that solves (benchmarks/README.md):
    # "solved" is judged on 10 greedy evaluation episodes every 2,000 env steps unless the user
    # says otherwise (--eval-every 0: on training returns)
    run_defaults={"eval_every": 2000},
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(ALGORITHM)
