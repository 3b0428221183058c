"""The observation space of a multi-agent environment: what tells the core, a schema and an
algorithm that an env has several agents, how many, and what the global state holds.

A multi-agent env reaches mprl as a gymnasium env (:mod:`mprl.lib.marl` adapts PettingZoo's
parallel API) whose observations are one row per agent: an :class:`AgentBox` of shape
``(agents, features)``. Its actions are one per agent (``MultiDiscrete`` of one ``Discrete``
per agent, or a ``Box`` of shape ``(agents, ...)``), its reward is the team's (the mean of the
agents' rewards), and each step's ``info`` holds ``agent_rewards`` (one per agent), ``alive``
(which agents are still playing) and ``state`` (the global state, for a centralized critic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np


class AgentBox(gym.spaces.Box):
    """One row of observations per agent, shape ``(len(agents), features)``; rows of agents
    whose own observation is shorter are zero-padded (``sizes`` tells each agent's own).

    :param agents: the agents' names, in row order.
    :param sizes: each agent's own observation size (at most ``features``).
    :param state: the space of the global state (``info["state"]``).
    """

    def __init__(
        self,
        agents: Sequence[str],
        sizes: Sequence[int],
        state: gym.spaces.Box,
        low: Any = -np.inf,
        high: Any = np.inf,
        dtype: Any = np.float32,
        seed: int | None = None,
    ) -> None:
        self.agents = tuple(agents)
        self.sizes = tuple(int(s) for s in sizes)
        self.state = state
        shape = (len(self.agents), max(self.sizes))
        super().__init__(low=low, high=high, shape=shape, dtype=dtype, seed=seed)

    def __repr__(self) -> str:
        return f"AgentBox({len(self.agents)} agents, {self.shape[1]} features, state {self.state})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, AgentBox)
            and super().__eq__(other)
            and (self.agents, self.sizes, self.state) == (other.agents, other.sizes, other.state)
        )


def agents_of(space: gym.Space) -> tuple[str, ...] | None:
    """The agents of a multi-agent env's observation space, ``None`` for a single-agent one."""
    return space.agents if isinstance(space, AgentBox) else None
