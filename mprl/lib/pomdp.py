"""Partially observed environments for recurrent policies, registered in gymnasium's registry
on import, so gymnasium's ``module:EnvId`` syntax reaches them::

    python -m mprl run --plugin ppo --env mprl.lib.pomdp:CartPoleNoVelocity-v1 --set core=lstm

``CartPoleNoVelocity-v1`` is CartPole-v1 with the velocities masked: the policy sees the cart's
position and the pole's angle only, so it has to remember earlier observations to balance.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["NO_VELOCITY", "VelocityMask", "make_cartpole_no_velocity"]

#: the env id registered by this module
NO_VELOCITY = "CartPoleNoVelocity-v1"


class VelocityMask(gym.ObservationWrapper):
    """Keep only the observation entries ``keep`` of a flat ``Box`` (CartPole: position 0 and
    angle 2; the velocities 1 and 3 masked)."""

    def __init__(self, env: gym.Env, keep: tuple[int, ...] = (0, 2)) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box)
        self.keep = np.asarray(keep)
        self.observation_space = gym.spaces.Box(
            space.low[self.keep], space.high[self.keep], dtype=space.dtype
        )

    def observation(self, observation: Any) -> Any:
        return observation[self.keep]


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    """CartPole-v1's env (500 steps) with the velocities masked: what
    ``gym.make("CartPoleNoVelocity-v1")`` builds (its time limit added by the registration)."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return VelocityMask(CartPoleEnv(**kwargs))


if NO_VELOCITY not in gym.registry:
    gym.register(
        NO_VELOCITY,
        entry_point=make_cartpole_no_velocity,
        max_episode_steps=500,
        reward_threshold=475.0,
    )
