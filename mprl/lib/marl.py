"""Multi-agent environments: PettingZoo's parallel API as one gymnasium env with an agent
dimension (:class:`AgentEnv`), and a worker's multi-agent envs stepped together into a rollout
``[T, envs, agents, ...]`` (:class:`AgentBatch`), for the multi-agent plugins (mappo, ippo) and
third-party ones to build on.

The conventions are those of :class:`AgentEnv` (the env room's,
:mod:`mprl.environments.agents`, which makes PettingZoo's envs; also in :mod:`mprl.spaces`): one
observation row per agent, one action per agent, the team's reward the mean of the agents'
(each agent's in ``info["agent_rewards"]``), ``info["alive"]`` and ``info["state"]``.
Agents with different action counts are masked (:func:`masked_logits`), and agents are grouped
in teams by name (:func:`mprl.spaces.team_of`), each team's episode return logged.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from mprl.environments.agents import AEC_FIX, AgentEnv, AgentReturns, is_aec, is_parallel_env
from mprl.errors import UsageError
from mprl.lib.envbatch import _Beat
from mprl.spaces import action_mask, agents_of, teams_of

__all__ = [
    "AEC_FIX",
    "AgentBatch",
    "AgentEnv",
    "AgentReturns",
    "agent_action_mask",
    "agent_rollout_spec",
    "is_aec",
    "is_parallel_env",
    "masked_logits",
]

#: what a masked action's logit becomes: its probability is exactly 0 in float32, and unlike
#: -inf it leaves no NaN in an entropy or a gradient
MASKED_LOGIT = -1e9


def masked_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``logits [..., A, n]`` with the actions an agent does not have (``mask [A, n]`` false:
    :func:`mprl.spaces.action_mask`) set to :data:`MASKED_LOGIT`, so that they are never
    sampled nor the argmax and take no probability (nor entropy); ``logits`` as they are
    where ``mask`` is ``None``."""
    if mask is None:
        return logits
    return logits.masked_fill(~mask, MASKED_LOGIT)


def agent_action_mask(space: gym.Space) -> torch.Tensor | None:
    """:func:`mprl.spaces.action_mask` of an action space as a bool tensor (for a model's
    buffer), ``None`` where every agent has every action."""
    mask = action_mask(space)
    return None if mask is None else torch.as_tensor(mask, dtype=torch.bool)


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
    episode returns logged (``ctx.log_episode(team, length, return_<agent>=...)``, and
    ``return_team_<team>=...``, the mean of its agents', where the agents' names make several
    teams and not one per agent: :func:`mprl.spaces.teams_of`), finished
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
        # several teams, not all of one agent (those would repeat the agents' returns)
        teams = teams_of(self.agents)
        several = 1 < len(teams) < len(self.agents)
        self.teams = {f"return_team_{t}": list(r) for t, r in teams.items()} if several else {}
        self.obs = torch.as_tensor(np.stack([o for o, _ in first]))
        self.state = torch.as_tensor(np.stack([i["state"] for _, i in first]))
        self.alive = torch.as_tensor(np.stack([i["alive"] for _, i in first]), dtype=torch.float32)
        self.returns = np.zeros((n, len(self.agents)))
        self.lengths = [0] * n
        self.cut: list[int] = []  # the envs whose episode a time limit cut at the last step

    def step(self, actions: np.ndarray, value: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Step every env with its agents' ``actions``; ``self.obs``, ``self.state`` and
        ``self.alive`` become the next ones (a new episode's where one ended). ``value(states)
        -> [k, agents]`` values the states where a time limit cut an episode (those of the
        envs ``self.cut``, in order: a recurrent critic picks their hidden states by it).
        Returns the agents' rewards ``[envs, agents]`` and the dones ``[envs]``."""
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
        self.cut = [i for i, _, _ in cut]  # the envs value() values, in its rows' order
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
        for key, rows in self.teams.items():
            per_agent[key] = float(self.returns[i][rows].mean())
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
