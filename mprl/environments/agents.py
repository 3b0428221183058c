"""Multi-agent environments: PettingZoo's parallel API as one gymnasium env with an agent
dimension (:class:`AgentEnv`), its modules found by id (``mpe2:simple_spread_v3``), AEC envs
refused saying how to convert them, and each agent's returns of an episode
(:class:`AgentReturns`); :mod:`mprl.lib.marl` steps such envs for the multi-agent plugins.

The conventions (also in :mod:`mprl.spaces`):

- observations: one row per agent (an :class:`mprl.spaces.AgentBox`; an agent's array
  observation flattened), padded with zeros to the longest agent's; an agent that has finished
  sees zeros;
- actions: one per agent, in the rows' order; a finished agent's is ignored. Discrete ones are
  a ``MultiDiscrete`` of each agent's count; where the counts differ (``simple_world_comm_v3``:
  the leader 20, the others 5) a policy has one output per action of the largest count and
  masks each agent's others (:attr:`AgentEnv.action_mask`, ``[agents, n]``, true where the
  agent has the action; :func:`mprl.spaces.action_mask` of the action space); an action an
  agent does not have is refused (``ValueError``), never passed to the env. Box actions must
  have one shape for all agents;
- reward: the team's, the mean over the agents of their rewards (a finished agent's counts as
  0), so the episode return mprl logs is the mean of the agents' returns; ``info["agent_rewards"]``
  holds each agent's;
- ``info["alive"]``: which agents are still playing after the step, ``info["state"]``: the global
  state, the env's own ``state()`` where it has one (MPE's: every agent's observation
  concatenated), else the agents' padded observations concatenated;
- the episode ends (terminated) when every agent has terminated, or (truncated) when the last
  agents left were truncated;
- teams: agents are grouped by their names (:func:`mprl.spaces.team_of`: ``adversary_0``,
  ``adversary_1`` -> ``adversary``); where there are several, not one per agent, each
  episode's team returns (the mean of the team's agents' returns) are logged as
  ``return_team_<team>`` beside each agent's ``return_<agent>``.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
import numpy as np

from mprl.envcheck import check_parallel_first_steps
from mprl.errors import UsageError
from mprl.spaces import AgentBox, action_mask


def is_parallel_env(env: Any) -> bool:
    """Whether ``env`` speaks PettingZoo's parallel API (``possible_agents``, a ``step`` of
    dicts), without importing PettingZoo."""
    return hasattr(env, "possible_agents") and not isinstance(env, gym.Env) and not is_aec(env)


def is_aec(env: Any) -> bool:
    """Whether ``env`` is a PettingZoo AEC env (agents acting in turn: ``agent_iter``)."""
    return hasattr(env, "agent_iter") and hasattr(env, "last")


AEC_FIX = (
    "mprl steps every agent at once (PettingZoo's parallel API): convert it with "
    "pettingzoo.utils.conversions.aec_to_parallel(env) in an mprl_make_env plugin, or use the "
    "module's parallel_env()"
)


def _action_space(name: str, spaces: dict[str, gym.Space]) -> gym.Space:
    """One space for every agent's action: ``MultiDiscrete`` of each agent's count (which
    may differ: :func:`mprl.spaces.action_mask` says which actions each has), or a ``Box``
    ``[agents, ...]`` of the agents' bounds (one shape for all)."""
    if all(isinstance(s, gym.spaces.Discrete) for s in spaces.values()):
        starts = {a: int(s.start) for a, s in spaces.items() if int(s.start) != 0}
        if starts:
            detail = ", ".join(f"{a}: starts at {n}" for a, n in starts.items())
            raise UsageError(
                f"environment {name!r}: its agents' actions must start at 0 ({detail})"
            )
        return gym.spaces.MultiDiscrete([int(s.n) for s in spaces.values()])
    if all(isinstance(s, gym.spaces.Box) for s in spaces.values()):
        shapes = {a: s.shape for a, s in spaces.items()}
        if len(set(shapes.values())) == 1:
            low = np.stack([s.low for s in spaces.values()])
            high = np.stack([s.high for s in spaces.values()])
            return gym.spaces.Box(low, high, dtype=np.float32)
        detail = ", ".join(f"{a}: {s}" for a, s in shapes.items())
        raise UsageError(f"environment {name!r}: its agents' continuous actions have different "
                         f"shapes ({detail}); mprl takes Box actions of one shape for all agents "
                         "(agents with different Discrete counts are masked)")  # fmt: skip
    kinds = ", ".join(f"{a}: {type(s).__name__}" for a, s in spaces.items())
    raise UsageError(
        f"environment {name!r}: its agents' action spaces are not all Discrete or all Box ({kinds})"
    )


def _obs_sizes(name: str, spaces: dict[str, gym.Space]) -> list[int]:
    bad = [a for a, s in spaces.items() if not isinstance(s, gym.spaces.Box)]
    if bad:
        shapes = ", ".join(f"{a}: {spaces[a]}" for a in bad)
        raise UsageError(
            f"environment {name!r}: agents {', '.join(bad)} do not observe arrays ({shapes}); "
            "turn their observations into one Box (gymnasium.spaces.flatten_space, or "
            "supersuit's flatten_v0) in an mprl_make_env plugin"
        )
    return [int(np.prod(s.shape)) for s in spaces.values()]  # a grid observation, flattened


class AgentEnv(gym.Env):
    """A PettingZoo parallel env as one gymnasium env with an agent dimension (the
    conventions above). ``render()`` is the env's own (``render_mode="rgb_array"``: frames).
    What the parallel env returns on its first steps is checked agent by agent
    (:func:`mprl.envcheck.check_parallel_first_steps`): a NaN reward, an observation of another
    shape than the agent's space, is named with its agent.

    :param env: the parallel env (``module.parallel_env(**kwargs)``).
    :param name: what the user called it, for messages.
    """

    def __init__(self, env: Any, name: str = "") -> None:
        _drop_checks(env)
        self.env, self.name = env, name or type(env).__name__
        self.agent_names = tuple(env.possible_agents)
        if not self.agent_names:
            raise UsageError(f"environment {self.name!r} has no agents")
        obs_spaces = {a: env.observation_space(a) for a in self.agent_names}
        sizes = _obs_sizes(self.name, obs_spaces)
        self.width = max(sizes)
        state_space = getattr(env, "state_space", None)
        self.own_state = isinstance(state_space, gym.spaces.Box) and len(state_space.shape) == 1
        if not self.own_state:
            width = len(self.agent_names) * self.width
            state_space = gym.spaces.Box(-np.inf, np.inf, (width,), np.float32)
        self.observation_space = AgentBox(self.agent_names, sizes, state_space)
        self.action_space = _action_space(
            self.name, {a: env.action_space(a) for a in self.agent_names}
        )
        #: which actions each agent has (``[agents, n]``), ``None`` where all have all
        self.action_mask = action_mask(self.action_space)
        self._counts = getattr(self.action_space, "nvec", None)
        self.render_mode = getattr(env, "render_mode", None)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self._rows = {a: i for i, a in enumerate(self.agent_names)}
        self._obs = np.zeros(self.observation_space.shape, np.float32)
        check_parallel_first_steps(env, self.name)

    def _observe(self, observations: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        obs = np.zeros(self.observation_space.shape, np.float32)
        for agent, o in observations.items():
            row = np.asarray(o, np.float32).ravel()
            obs[self._rows[agent], : row.size] = row
        alive = np.array([a in self.env.agents for a in self.agent_names])
        state = np.asarray(self.env.state(), np.float32) if self.own_state else obs.ravel()
        self._obs = obs
        return obs, {"alive": alive, "state": state}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        observations, _ = self.env.reset(seed=seed, options=options)
        return self._observe(observations)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        acting = list(self.env.agents)
        if self._counts is not None:  # an action an agent does not have never reaches the env
            self._check_actions(np.asarray(action), acting)
        actions = {a: _one(action[self._rows[a]]) for a in acting}
        observations, rewards, _, truncated, _ = self.env.step(actions)
        obs, info = self._observe(observations)
        agent_rewards = np.zeros(len(self.agent_names), np.float32)
        for agent, r in rewards.items():
            agent_rewards[self._rows[agent]] = r
        info["agent_rewards"] = agent_rewards
        over = not self.env.agents
        cut = any(truncated.get(a, False) for a in acting)
        return obs, float(agent_rewards.mean()), over and not cut, over and cut, info

    def _check_actions(self, action: np.ndarray, acting: list[str]) -> None:
        rows = [self._rows[a] for a in acting]
        bad = [r for r in rows if not 0 <= action[r] < self._counts[r]]
        if bad:
            detail = ", ".join(
                f"{self.agent_names[r]}: {action[r]} (it has {self._counts[r]})" for r in bad
            )
            raise ValueError(f"environment {self.name!r}: actions out of range ({detail})")

    def state(self) -> np.ndarray:
        return np.asarray(self.env.state(), np.float32) if self.own_state else self._obs.ravel()

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


#: PettingZoo's wrappers that only check their caller (reset before step, actions in the
#: space): mprl calls in order, with actions of the space
_CHECKS = ("OrderEnforcingWrapper", "AssertOutOfBoundsWrapper")


def _drop_checks(env: Any) -> None:
    """Take the checking wrappers (:data:`_CHECKS`) off the AEC env under a parallel env that
    PettingZoo converted from one (MPE's ``parallel_env()``): their attribute lookups cost as
    much as the physics (a simple_spread step: 0.55 -> 0.34 ms). Wrappers that change
    something (clipping actions) stay."""
    aec = getattr(env, "aec_env", None)
    layer = aec
    while type(layer).__name__ in _CHECKS and hasattr(layer, "env"):
        layer = layer.env
    if layer is not aec:
        env.aec_env = layer


def _one(action: Any) -> Any:
    """An agent's action as PettingZoo envs take it: a Python int for a discrete one."""
    return int(action) if np.ndim(action) == 0 else np.asarray(action, np.float32)


class AgentReturns(gym.Wrapper):
    """Each finished episode's per-agent returns (``info["agent_rewards"]`` summed), in
    ``self.returns``: one row per episode, in the order they ended (``mprl eval``)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.returns: list[list[float]] = []
        self._sums: np.ndarray | None = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._sums = None
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        rewards = np.asarray(info["agent_rewards"], np.float64)
        self._sums = rewards if self._sums is None else self._sums + rewards
        if terminated or truncated:
            self.returns.append(self._sums.tolist())
        return obs, reward, terminated, truncated, info


def pettingzoo_module(env_id: str) -> Any:
    """The module of a PettingZoo env named ``package:env`` (``mpe2:simple_spread_v3``,
    ``pettingzoo.sisl:multiwalker_v9``), or ``None`` when ``env_id`` names none (a gymnasium
    ``module:Env-v0`` id is gymnasium's)."""
    package, colon, name = env_id.partition(":")
    if not colon or not name.isidentifier():
        return None
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ImportError as exc:
        if exc.name is None or f"{package}.{name}".startswith(exc.name):
            return None  # no such module: gymnasium's id, or a typo gymnasium reports
        raise UsageError(
            f"environment {env_id!r} needs the package {exc.name!r}, which is not installed: "
            f"pip install {exc.name.split('.')[0]} (or the env family's extra, e.g. "
            f'pip install "pettingzoo[{package.split(".")[-1]}]")'
        ) from None
    return module if hasattr(module, "parallel_env") or hasattr(module, "env") else None


def make_parallel(env_id: str, module: Any, kwargs: dict[str, Any], name: str = "") -> gym.Env:
    """The PettingZoo env ``module.parallel_env(**kwargs)`` as one gymnasium env
    (:class:`AgentEnv`, called ``name`` in messages: ``env_id`` with its arguments); an
    AEC-only module is refused, saying how to convert. What ``parallel_env`` raises is its own
    (the env room's ``mprl_make_env`` names the env and the arguments it was given)."""
    if not hasattr(module, "parallel_env"):
        raise UsageError(f"environment {env_id!r} has only PettingZoo's AEC API: {AEC_FIX}")
    return AgentEnv(module.parallel_env(**kwargs), name or env_id)


def adapt(env: Any, env_id: str) -> gym.Env | None:
    """A PettingZoo env a plugin returned, as mprl takes it: a parallel one adapted, an AEC one
    refused (saying how to convert it); ``None`` for anything else."""
    if is_aec(env):
        raise UsageError(f"it is a PettingZoo AEC env (agents acting in turn): {AEC_FIX}")
    return AgentEnv(env, env_id) if is_parallel_env(env) else None
