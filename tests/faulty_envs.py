"""Envs that return what no env should, for the tests of mprl's check of an env's first steps
(:mod:`mprl.envcheck`): made by id, so that a spawned worker makes them too.

- ``tests.faulty_envs:Faulty-v0(fault=..., at=k)``: a gymnasium env (a 10-step corridor, 3
  features) whose reset (``at=0``) or step ``k`` returns the ``fault`` of :data:`FAULTS`;
- ``tests:faulty_envs(fault=..., at=k)``: a PettingZoo parallel env of two agents (this module's
  :func:`parallel_env`, made through mprl's PettingZoo adapter) whose ``agent_1`` does so.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

#: fault -> (the field it breaks, what it returns there)
FAULTS: dict[str, tuple[str, Any]] = {
    "none": ("", None),
    "nan_obs": ("observation", np.array([0.0, np.nan, 0.0], np.float32)),
    "inf_obs": ("observation", np.array([0.0, 0.0, -np.inf], np.float32)),
    "obs_shape": ("observation", np.zeros(4, np.float32)),
    "obs_text": ("observation", np.array(["a", "b", "c"])),
    "nan_reward": ("reward", float("nan")),
    "inf_reward": ("reward", float("inf")),
    "str_reward": ("reward", "1.0"),
    "array_reward": ("reward", np.ones(2, np.float32)),
    "none_terminated": ("terminated", None),
    "list_info": ("info", []),
}

LENGTH = 10


class Faulty(gym.Env):
    """Walk right to the end of a corridor (``LENGTH`` steps, reward 1 per step); the reset
    (``at=0``) or step ``at`` of each episode returns ``fault`` in its field."""

    metadata: dict = {"render_modes": []}

    def __init__(self, fault: str = "none", at: int = 1, render_mode: str | None = None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
        self.field, self.bad = FAULTS[fault]
        self.at = at
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.pos / LENGTH, 0.0, 0.0], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self.pos = 0
        if self.at == 0 and self.field == "observation":
            return self.bad, {}
        if self.at == 0 and self.field == "info":
            return self._obs(), self.bad
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.pos += 1
        out: dict[str, Any] = {
            "observation": self._obs(), "reward": 1.0, "terminated": self.pos >= LENGTH,
            "truncated": False, "info": {},
        }  # fmt: skip
        if self.pos == self.at and self.field:
            out[self.field] = self.bad
        return tuple(out.values())


if "Faulty-v0" not in gym.registry:  # imported again by name (tests.faulty_envs:Faulty-v0)
    gym.register("Faulty-v0", entry_point=Faulty)


class FaultyAgents:
    """A PettingZoo parallel env (duck-typed: no PettingZoo needed) of two agents walking the
    corridor side by side, observing 3 features each; ``agent_1``'s reset (``at=0``) or step
    ``at`` returns ``fault`` in its field."""

    metadata: dict = {"render_modes": [], "name": "faulty_agents"}

    def __init__(self, fault: str = "none", at: int = 1) -> None:
        self.field, self.bad = FAULTS[fault]
        self.at = at
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self.pos = 0

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _obs(self, agent: str, bad: bool) -> Any:
        good = np.array([self.pos / LENGTH, 0.0, 0.0], np.float32)
        return self.bad if bad and agent == "agent_1" and self.field == "observation" else good

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        self.pos, self.agents = 0, list(self.possible_agents)
        return {a: self._obs(a, self.at == 0) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        self.pos += 1
        bad = self.pos == self.at
        over = self.pos >= LENGTH
        observations = {a: self._obs(a, bad) for a in self.agents}
        rewards: dict[str, Any] = {a: 1.0 for a in self.agents}
        if bad and self.field == "reward":
            rewards["agent_1"] = self.bad
        terminations = {a: over for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos: dict[str, Any] = {a: {} for a in self.agents}
        if over:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def close(self) -> None:
        pass


def parallel_env(**kwargs: Any) -> FaultyAgents:
    """What mprl makes of ``--env tests:faulty_envs(...)`` (PettingZoo's module convention)."""
    return FaultyAgents(**kwargs)
