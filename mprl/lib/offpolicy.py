"""Batched acting for off-policy workers: a worker's environments stepped together (an
:class:`~mprl.lib.envbatch.EnvBatch`: the same seeding, episode logging, resets and EnvPool
support as the rollout workers), every transition added to a replay buffer, optionally as
n-step returns (the built-in dqn collects with it)::

    collector = ReplayCollector(ctx, ctx.state.replay, n=4, gamma=0.99)
    while not ctx.should_stop():
        with torch.no_grad():
            q = local(collector.obs.float())
        collector.step(epsilon_greedy(q, eps, generator))  # one row per env, steps counted

A time limit is bootstrapped the off-policy way: the row of a step a time limit cut keeps
``done = 0`` and ``next_obs`` = where the episode stopped (not the next episode's start), so the
learner's target values it (SB3's ``handle_timeout_termination``); ``done = 1`` only where the
episode terminated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mprl.lib.envbatch import EnvBatch
from mprl.schema import Dims, transition_row


def nstep_row(dims: Dims) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """:func:`mprl.schema.transition_row` and ``discount``: what the bootstrap value of
    ``next_obs`` is multiplied by, ``gamma ** k`` for a row summing ``k`` rewards (``k`` is the
    n-step horizon, fewer where the episode ended first). ``reward`` is then the discounted sum
    of those ``k`` rewards; the learner's target is ``reward + discount * (1 - done) * V(next)``.
    Declare a :class:`mprl.schema.ReplayBuffer` with ``row=nstep_row`` for
    :class:`ReplayCollector` with ``n_step > 1``."""
    return {**transition_row(dims), "discount": ((), torch.float32)}


def epsilon_greedy(
    q: torch.Tensor, eps: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Actions ``[B]`` (int64) for Q values ``[B, A]``: each the argmax, or with probability
    ``eps`` uniformly random (drawn with ``generator``: a seeded worker repeats)."""
    batch, n_actions = q.shape
    greedy = q.argmax(1)
    if eps <= 0.0:
        return greedy
    explore = torch.rand(batch, generator=generator) < eps
    random = torch.randint(n_actions, (batch,), generator=generator)
    return torch.where(explore, random, greedy)


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """``start`` moving linearly to ``end`` over ``duration`` steps, then ``end`` (SB3's
    exploration schedule, in steps rather than a fraction of the budget)."""
    if duration <= 0 or t >= duration:
        return end
    return start + (end - start) * t / duration


class ReplayCollector:
    """The environments of one off-policy worker, stepped together, each step's transitions
    added to ``replay`` in one call and counted (``ctx.add_steps``).

    :param ctx: the worker's Context (environments, seeds and episode logging come from it).
    :param replay: the worker's replay buffer (``ctx.state.NAME``); its rows are
        :func:`mprl.schema.transition_row`'s, or :func:`nstep_row`'s with ``discount``.
    :param n: how many environments.
    :param gamma: the discount of n-step returns (and of ``discount``).
    :param n_step: rewards summed per row (1: one-step transitions). A row is added once its
        ``n_step`` steps are taken, or when its episode ends (then with fewer).
    :param discount: write the ``discount`` field (default: when ``n_step > 1``, which needs it).
    :param pool: an EnvPool of ``n`` envs to step instead (as :class:`EnvBatch`'s).
    """

    def __init__(
        self,
        ctx: Any,
        replay: Any,
        n: int,
        gamma: float,
        *,
        n_step: int = 1,
        discount: bool | None = None,
        pool: Any = None,
    ) -> None:
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.discount = n_step > 1 if discount is None else discount
        if n_step > 1 and not self.discount:
            raise ValueError("n-step rows need their discount: declare the row as nstep_row")
        self.ctx, self.replay, self.gamma, self.n_step = ctx, replay, gamma, n_step
        self.envs = EnvBatch(ctx, n, gamma, pool=pool)
        self.n = n
        self._powers = torch.tensor([gamma**k for k in range(n_step + 1)], dtype=torch.float64)
        # the last n_step steps of every env: observation, action, reward (a ring)
        self._obs: torch.Tensor | None = None
        self._actions: torch.Tensor | None = None
        self._rewards = torch.zeros((n_step, n), dtype=torch.float64)
        self._pending = np.zeros(n, dtype=np.int64)  # steps of each env not yet in a row
        self._t = 0
        #: the envs whose episode ended at the last :meth:`step` (their indices, in order):
        #: where a worker resets per-episode state, such as an exploration noise's
        self.ended: list[int] = []

    @property
    def obs(self) -> torch.Tensor:
        """The observations to act on, ``[n, *observation_shape]``
        (:func:`mprl.schema.obs_dtype`: uint8 frames stay uint8)."""
        return self.envs.obs

    def collect(self, act: Callable[[torch.Tensor], Any], steps: int = 1) -> int:
        """Act ``steps`` times with ``act(obs) -> actions`` (or ``(actions, env_actions)``, as
        :meth:`step` takes them); the rows added."""
        rows = 0
        for _ in range(steps):
            chosen = act(self.obs)
            rows += self.step(*chosen) if isinstance(chosen, tuple) else self.step(chosen)
        return rows

    def step(self, actions: torch.Tensor, env_actions: Any = None) -> int:
        """Step every env once with ``actions`` (``[n, ...]``, as the replay stores them:
        Discrete actions int64; SAC's squashed ones), given to the envs as ``env_actions``
        (default: ``actions`` as a numpy array); add the transitions completed to the replay
        buffer and count ``n`` env steps. Returns the rows added; :attr:`ended` says which
        envs' episodes ended."""
        obs = self.envs.obs
        if env_actions is None:
            env_actions = actions.numpy()
        rewards, _, ends = self.envs.advance(env_actions)
        self.ended = [i for i, _, _ in ends]
        if self.n_step == 1:
            rows = self._one_step(obs, actions, rewards, ends)
        else:
            rows = self._n_step(obs, actions, rewards, ends)
        if rows is not None:
            self.replay.add(**rows)
        self.ctx.add_steps(self.n)
        return 0 if rows is None else len(rows["reward"])

    def _one_step(self, obs: torch.Tensor, actions: torch.Tensor, rewards: Any, ends: list) -> dict:
        next_obs = self.envs.obs
        done = torch.zeros(self.n, dtype=torch.float32)
        if ends:
            next_obs = next_obs.clone()
            for i, last, terminated in ends:
                next_obs[i] = torch.as_tensor(last, dtype=next_obs.dtype)
                done[i] = float(terminated)
        rows = {
            "obs": obs,
            "action": actions,
            "reward": torch.as_tensor(np.asarray(rewards, dtype=np.float32)),
            "next_obs": next_obs,
            "done": done,
        }
        if self.discount:
            rows["discount"] = torch.full((self.n,), self.gamma, dtype=torch.float32)
        return rows

    def _n_step(
        self, obs: torch.Tensor, actions: torch.Tensor, rewards: Any, ends: list
    ) -> dict | None:
        n_step, at = self.n_step, self._t % self.n_step
        if self._obs is None:
            self._obs = torch.empty((n_step, *obs.shape), dtype=obs.dtype)
            self._actions = torch.empty((n_step, *actions.shape), dtype=actions.dtype)
        assert self._actions is not None
        self._obs[at], self._actions[at] = obs, actions
        self._rewards[at] = torch.as_tensor(np.asarray(rewards, dtype=np.float64))
        self._t += 1
        self._pending += 1
        parts: list[dict[str, torch.Tensor]] = []
        ended = {i for i, _, _ in ends}
        full = [i for i in np.flatnonzero(self._pending >= n_step).tolist() if i not in ended]
        if full:  # n steps since the oldest: a whole n-step row each, bootstrapped from here
            parts.append(self._rows(full, n_step, self.envs.obs[full], 0.0, at))
            self._pending[full] = n_step - 1
        for i, last, terminated in ends:  # every step not in a row yet, each to the end
            last_t = torch.as_tensor(last, dtype=obs.dtype)[None]
            for k in range(int(self._pending[i]), 0, -1):
                parts.append(self._rows([i], k, last_t, float(terminated), at))
            self._pending[i] = 0
        if not parts:
            return None
        return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}

    def _rows(
        self, envs: list[int], k: int, next_obs: torch.Tensor, done: float, at: int
    ) -> dict[str, torch.Tensor]:
        """The rows of ``envs`` that start ``k - 1`` steps before ring position ``at`` and sum
        ``k`` rewards up to it."""
        n_step = self.n_step
        order = [(at - k + 1 + j) % n_step for j in range(k)]
        start = order[0]
        assert self._obs is not None and self._actions is not None
        summed = (self._powers[:k, None] * self._rewards[order][:, envs]).sum(0)
        count = len(envs)
        return {
            "obs": self._obs[start, envs],
            "action": self._actions[start, envs],
            "reward": summed.to(torch.float32),
            "next_obs": next_obs,
            "done": torch.full((count,), done, dtype=torch.float32),
            "discount": torch.full((count,), self.gamma**k, dtype=torch.float32),
        }

    def close(self) -> None:
        self.envs.close()
