"""The observation space of a multi-agent environment: what tells the core, a schema and an
algorithm that an env has several agents, how many, what the global state holds, which
actions each agent has and which team it plays for.

A multi-agent env reaches mprl as a gymnasium env (:mod:`mprl.lib.marl` adapts PettingZoo's
parallel API) whose observations are one row per agent: an :class:`AgentBox` of shape
``(agents, features)``. Its actions are one per agent (``MultiDiscrete`` of each agent's
``Discrete`` count, or a ``Box`` of shape ``(agents, ...)``), its reward is the team's (the
mean of the agents' rewards), and each step's ``info`` holds ``agent_rewards`` (one per
agent), ``alive`` (which agents are still playing) and ``state`` (the global state, for a
centralized critic).

Agents with different action counts (``simple_world_comm_v3``'s leader: 20, the others 5)
share one ``MultiDiscrete`` whose entries are each agent's count; a policy with one output per
action of the largest count masks each agent's others (:func:`action_mask`, ``[agents, n]``,
true where the action exists) so that they are never chosen. Agents are grouped in teams by
their names (:func:`team_of`: ``adversary_0`` plays for ``adversary``).
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


def action_mask(space: gym.Space) -> np.ndarray | None:
    """Which actions each agent of a multi-agent env has: ``[agents, n]`` booleans (``n`` the
    largest count), true where the agent has the action, for a ``MultiDiscrete`` whose agents'
    counts differ; ``None`` where every action of the space is every agent's (one count for
    all, a ``Box``), so that a policy needs no mask."""
    if not isinstance(space, gym.spaces.MultiDiscrete) or space.nvec.ndim != 1:
        return None
    counts = space.nvec.astype(np.int64)
    if (counts == counts.max()).all():
        return None
    return np.arange(counts.max()) < counts[:, None]


def team_of(agent: str) -> str:
    """The team an agent plays for, from its name: the name without its last ``_<number>``
    (``adversary_0`` and ``adversary_1``: ``adversary``; ``leadadversary_0``:
    ``leadadversary``; ``agent_1``: ``agent``); a name without a number is its own team."""
    head, sep, tail = agent.rpartition("_")
    return head if sep and head and tail.isdigit() else agent


def teams_of(agents: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The agents' teams (:func:`team_of`), each with its agents' rows, in the order the
    teams first appear."""
    teams: dict[str, list[int]] = {}
    for row, agent in enumerate(agents):
        teams.setdefault(team_of(agent), []).append(row)
    return {team: tuple(rows) for team, rows in teams.items()}
