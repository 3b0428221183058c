"""Multi-agent environments: PettingZoo's parallel API as one gymnasium env with an agent
dimension (:class:`AgentEnv`), and a worker's multi-agent envs stepped together into a rollout
``[T, envs, agents, ...]`` (:class:`AgentBatch`), for the multi-agent plugins (mappo, ippo) and
third-party ones to build on.

The conventions (also in :mod:`mprl.spaces`):

- observations: one row per agent (an :class:`mprl.spaces.AgentBox`; an agent's array
  observation flattened), padded with zeros to the longest agent's; an agent that has finished
  sees zeros;
- actions: one per agent, in the rows' order; a finished agent's is ignored;
- reward: the team's, the mean over the agents of their rewards (a finished agent's counts as
  0), so the episode return mprl logs is the mean of the agents' returns; ``info["agent_rewards"]``
  holds each agent's;
- ``info["alive"]``: which agents are still playing after the step, ``info["state"]``: the global
  state, the env's own ``state()`` where it has one (MPE's: every agent's observation
  concatenated), else the agents' padded observations concatenated;
- the episode ends (terminated) when every agent has terminated, or (truncated) when the last
  agents left were truncated.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from mprl.errors import UsageError
from mprl.lib.envbatch import _Beat
from mprl.spaces import AgentBox, agents_of


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
    first = next(iter(spaces.values()))
    if all(isinstance(s, gym.spaces.Discrete) for s in spaces.values()):
        sizes = {a: int(s.n) for a, s in spaces.items()}
        if len(set(sizes.values())) == 1:
            return gym.spaces.MultiDiscrete([first.n] * len(spaces))
        detail = ", ".join(f"{a}: {n}" for a, n in sizes.items())
        raise UsageError(f"environment {name!r}: its agents have different action counts ({detail})"
                         "; mprl needs one action space for all agents")  # fmt: skip
    if all(isinstance(s, gym.spaces.Box) for s in spaces.values()):
        shapes = {a: s.shape for a, s in spaces.items()}
        if len(set(shapes.values())) == 1:
            low = np.stack([s.low for s in spaces.values()])
            high = np.stack([s.high for s in spaces.values()])
            return gym.spaces.Box(low, high, dtype=np.float32)
        detail = ", ".join(f"{a}: {s}" for a, s in shapes.items())
        raise UsageError(f"environment {name!r}: its agents have different action shapes ({detail})"
                         "; mprl needs one action space for all agents")  # fmt: skip
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
    """A PettingZoo parallel env as one gymnasium env with an agent dimension (the module's
    conventions). ``render()`` is the env's own (``render_mode="rgb_array"``: frames).

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
        self.render_mode = getattr(env, "render_mode", None)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self._rows = {a: i for i, a in enumerate(self.agent_names)}
        self._obs = np.zeros(self.observation_space.shape, np.float32)

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


def agent_rollout_spec(
    obs_space: gym.Space, act_space: gym.Space, steps: int, envs: int
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The :class:`mprl.schema.Rollouts` spec :meth:`AgentBatch.rollout` writes: ``steps``
    steps of ``envs`` multi-agent envs of ``A`` agents. ``obs`` ``[T + 1, envs, A, features]``,
    ``state`` ``[T + 1, envs, state]``, per agent ``action``, ``logp``, ``reward`` and ``alive``
    (the agent acted at that step: 1.0, else 0.0), and ``done`` ``[T, envs]`` (the episode
    ended after that step)."""
    agents = agents_of(obs_space)
    if agents is None:
        raise UsageError(f"a multi-agent rollout needs a multi-agent env, got {obs_space}")
    a = len(agents)
    discrete = isinstance(act_space, gym.spaces.MultiDiscrete)
    return {
        "obs": ((steps + 1, envs, *obs_space.shape), torch.float32),
        "state": ((steps + 1, envs, *obs_space.state.shape), torch.float32),
        "action": ((steps, envs, a), torch.int64)
        if discrete
        else ((steps, envs, *act_space.shape), torch.float32),
        "logp": ((steps, envs, a), torch.float32),
        "reward": ((steps, envs, a), torch.float32),
        "alive": ((steps, envs, a), torch.float32),
        "done": ((steps, envs), torch.float32),
    }


class AgentBatch:
    """The multi-agent envs of one worker, stepped together: the team's and each agent's
    episode returns logged (``ctx.log_episode(team, length, return_<agent>=...)``), finished
    episodes reset, and where a time limit cut an episode, ``gamma`` times the value of where
    it stopped added to each live agent's last reward (as :class:`mprl.lib.envbatch.EnvBatch`
    does for one agent).

    :param ctx: the worker's Context.
    :param n: how many environments.
    :param gamma: the discount of the truncation bootstrap.
    """

    def __init__(self, ctx: Any, n: int, gamma: float) -> None:
        self.ctx, self.n, self.gamma = ctx, n, gamma
        self.beat = beat = _Beat(ctx)
        beat(starting=True)
        self.envs = [ctx.make_env(i) for i in beat.each(range(n))]
        first = [env.reset() for env in beat.each(self.envs)]
        beat()
        self.agents = agents_of(self.envs[0].observation_space) or ()
        self.keys = [f"return_{a}" for a in self.agents]
        self.obs = torch.as_tensor(np.stack([o for o, _ in first]))
        self.state = torch.as_tensor(np.stack([i["state"] for _, i in first]))
        self.alive = torch.as_tensor(np.stack([i["alive"] for _, i in first]), dtype=torch.float32)
        self.returns = np.zeros((n, len(self.agents)))
        self.lengths = [0] * n

    def step(self, actions: np.ndarray, value: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Step every env with its agents' ``actions``; ``self.obs``, ``self.state`` and
        ``self.alive`` become the next ones (a new episode's where one ended). ``value(states)
        -> [k, agents]`` values the states where a time limit cut an episode. Returns the
        agents' rewards ``[envs, agents]`` and the dones ``[envs]``."""
        rewards = np.zeros((self.n, len(self.agents)), np.float32)
        dones = np.zeros(self.n, np.float32)
        obs, states, alive, cut = [], [], [], []
        for i, env in enumerate(self.envs):
            o, _, terminated, truncated, info = env.step(actions[i])
            rewards[i] = info["agent_rewards"]
            self.returns[i] += rewards[i]
            self.lengths[i] += 1
            if terminated or truncated:
                dones[i] = 1.0
                if truncated:
                    cut.append((i, info["state"], self.alive[i].numpy().copy()))
                self._log(i)
                o, info = env.reset()
            obs.append(o)
            states.append(info["state"])
            alive.append(info["alive"])
        if cut and value is not None:
            with torch.no_grad():
                values = value(torch.as_tensor(np.stack([s for _, s, _ in cut]))).numpy()
            for (i, _, live), v in zip(cut, values, strict=True):
                rewards[i] += self.gamma * v * live
        self.obs = torch.as_tensor(np.stack(obs))
        self.state = torch.as_tensor(np.stack(states))
        self.alive = torch.as_tensor(np.stack(alive), dtype=torch.float32)
        self.beat()
        return rewards, dones

    def _log(self, i: int) -> None:
        team = float(self.returns[i].mean())
        per_agent = dict(zip(self.keys, self.returns[i].tolist(), strict=True))
        self.ctx.log_episode(team, self.lengths[i], **per_agent)
        self.returns[i] = 0.0
        self.lengths[i] = 0

    def rollout(self, act: Any, value: Any, slot: dict[str, torch.Tensor]) -> None:
        """Act for as many steps as ``slot`` holds and write the rollout into it in place (the
        fields of :func:`agent_rollout_spec`). ``act(obs [envs, A, F]) -> (actions, logp)``
        acts for every agent of every env at once (continuous actions are clipped to the space
        for the env, kept as sampled in the rollout); ``value`` is :meth:`step`'s."""
        steps = slot["action"].shape[0]
        for t in range(steps):
            slot["obs"][t] = self.obs
            slot["state"][t] = self.state
            slot["alive"][t] = self.alive
            with torch.no_grad():
                actions, logp = act(self.obs)
            slot["action"][t] = actions
            slot["logp"][t] = logp
            rewards, dones = self.step(self._to_env(actions.numpy()), value)
            slot["reward"][t] = torch.from_numpy(rewards)
            slot["done"][t] = torch.from_numpy(dones)
        slot["obs"][steps] = self.obs
        slot["state"][steps] = self.state
        self.ctx.add_steps(steps * self.n)

    def _to_env(self, actions: np.ndarray) -> np.ndarray:
        """Sampled continuous actions clipped to the action space (the rollout keeps them as
        sampled: their log-probabilities are of those)."""
        space = self.envs[0].action_space
        if isinstance(space, gym.spaces.Box):
            return np.clip(actions, space.low, space.high)
        return actions

    def close(self) -> None:
        for env in self.envs:
            env.close()


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
