"""A worker's environments stepped together, and the rollout they write: for algorithm plugins
to build on (the built-in a3c, impala and ppo collect with it; :mod:`mprl.lib.offpolicy` steps
it for the replay buffers of off-policy workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from mprl.lib.nets import ActorCritic
from mprl.lib.norms import ReturnNorm
from mprl.lib.recurrent import state_spec
from mprl.schema import obs_dtype

__all__ = ["EnvBatch", "ReturnNorm", "rollout_spec"]  # ReturnNorm is mprl.lib.norms's


def rollout_spec(
    obs_space: gym.Space, act_space: gym.Space, steps: int, envs: int, config: Any = None
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The :class:`mprl.schema.Rollouts` spec of :meth:`EnvBatch.rollout`: ``steps`` steps of
    ``envs`` environments, and the observations after the last step (uint8 frames stay uint8:
    :func:`mprl.schema.obs_dtype`). With a ``config`` whose ``core`` is recurrent, the hidden
    state at the rollout's start too (:func:`mprl.lib.recurrent.state_spec`)."""
    discrete = isinstance(act_space, gym.spaces.Discrete)
    return {
        "obs": ((steps + 1, envs, *obs_space.shape), obs_dtype(obs_space)),
        "action": ((steps, envs), torch.int64)
        if discrete
        else ((steps, envs, *act_space.shape), torch.float32),
        "logp": ((steps, envs), torch.float32),
        "reward": ((steps, envs), torch.float32),
        "done": ((steps, envs), torch.float32),
        **(state_spec(config, obs_space, envs) if config is not None else {}),
    }


class _Beat:
    """The heartbeat of the process that steps an :class:`EnvBatch`: building and resetting
    thousands of envs is start-up work (``--set envs_per_worker=100000`` takes minutes, and
    must not look like a hung worker), and a step of many envs takes long too. A no-op for a
    context without a channel (a test's stand-in)."""

    def __init__(self, ctx: Any) -> None:
        channel = getattr(ctx, "channel", None)
        beat = getattr(channel, "beat", None)
        rank, workers = getattr(ctx, "rank", None), getattr(ctx, "n_workers", None)
        ok = callable(beat) and isinstance(rank, int) and isinstance(workers, int)
        self._beat = beat if ok else None
        self._slot = (workers if rank < 0 else rank) if ok else 0  # type: ignore[operator]

    def __call__(self, starting: bool = False) -> None:
        if self._beat is not None:
            self._beat(self._slot, starting=starting)

    def each(self, items: Any, starting: bool = True) -> Iterator[Any]:
        """``items``, with a beat before each (start-up work, by default)."""
        for item in items:
            self(starting)
            yield item


class EnvBatch:
    """The environments of one worker, stepped together: episode returns logged, time-limit
    truncation bootstrapped with the value of where the episode stopped, finished ones reset.
    Observations keep the dtype :func:`mprl.schema.obs_dtype` gives (uint8 frames stay uint8).
    The logged return is the env's own score: where a wrapper changed the rewards learned from
    (Atari's clipping), gymnasium's ``RecordEpisodeStatistics`` below it tells the raw one.

    With ``--env-batch envpool`` (or a ``pool`` given) one EnvPool steps them all in C++
    (:mod:`mprl.lib.envpool`); episodes, the truncation bootstrap and resets are the same: a
    finished env is reset within the step, so ``self.obs`` holds the new episode's start.

    :param ctx: the worker's Context (environments and episode logging come from it).
    :param n: how many environments.
    :param gamma: the discount used for the truncation bootstrap.
    :param pool: an EnvPool of ``n`` envs to step instead (:func:`mprl.lib.envpool.make_pool`).
    :param normalize_reward: learn from rewards scaled by :class:`ReturnNorm` (the truncation
        bootstrap is added after scaling: the value is in the scaled units).
    """

    def __init__(
        self, ctx: Any, n: int, gamma: float, pool: Any = None, normalize_reward: bool = False
    ) -> None:
        self.ctx, self.gamma = ctx, gamma
        self.return_norm = ReturnNorm(n, gamma) if normalize_reward else None
        self.beat = beat = _Beat(ctx)
        beat(starting=True)  # making and resetting the envs is start-up work
        run = getattr(ctx, "run", None)
        if pool is None and getattr(run, "env_batch", "gym") == "envpool":
            from mprl.lib.envpool import make_pool

            pool = make_pool(run.env, [ctx.env_seed(i) for i in range(n)])
        self.pool = pool
        if pool is None:
            self.envs = [ctx.make_env(i) for i in beat.each(range(n))]
            self.dtype = obs_dtype(self.envs[0].observation_space)
            self.obs = self._tensor(np.stack([env.reset()[0] for env in beat.each(self.envs)]))
        else:
            self.envs = []
            self.dtype = obs_dtype(pool.observation_space)
            self.obs = self._tensor(pool.reset()[0].copy())
        beat()  # start-up is over
        self.n = n
        # Python numbers, not a numpy array
        # why: see benchmarks/README.md, "EnvBatch bookkeeping in Python numbers"
        self.ep_return = [0.0] * n
        self.ep_start = [0] * n  # the value of self.t when each env's episode began
        self.t = 0  # steps of this batch so far
        self.rewards = np.zeros(n, dtype=np.float32)
        self.dones = np.zeros(n, dtype=np.float32)
        #: a recurrent model's hidden state of each env after the last step (``None``: zeros)
        self.state: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.n

    def step(self, model: ActorCritic, actions: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Step every env with ``actions``; ``self.obs`` becomes the next observations. Returns
        the rewards and dones (views, overwritten by the next call)."""
        self.rewards[:], self.dones[:], _ = self._step(model, actions)
        self.beat()  # a step of thousands of envs takes a while
        return self.rewards, self.dones

    def _step(
        self, model: ActorCritic, actions: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[Any, Any, list[int]]:
        """:meth:`step` without the beat: the rewards learned from, the dones, and the envs
        whose episode ended. ``state``: a recurrent model's, after this step."""
        rewards, dones, ends = self.advance(model.to_env(actions))
        cut = [(i, o) for i, o, terminated in ends if not terminated]
        rewards, dones = self._learned(model, rewards, dones, cut, state)
        return rewards, dones, [i for i, _, _ in ends]

    def advance(self, env_actions: Any) -> tuple[Any, Any, list[tuple[int, np.ndarray, bool]]]:
        """Step every env with ``env_actions`` (as the envs take them): episodes logged,
        finished envs reset, ``self.obs`` the next observations (a new episode's first where
        one ended). Returns the env's rewards and dones (a sequence each, one per env) and,
        for each env whose episode ended, ``(index, its last observation, terminated)``:
        ``terminated`` false where a time limit cut it (an off-policy learner bootstraps
        from that observation; :meth:`step` adds its value to the reward instead)."""
        if self.pool is not None:
            return self._advance_pool(env_actions)
        ep_return = self.ep_return
        self.t += 1
        next_obs, rewards, dones = [], [], [False] * len(self.envs)
        ends: list[tuple[int, np.ndarray, bool]] = []
        for i, env in enumerate(self.envs):
            if i and not i % 1024:  # a step of thousands of envs takes a while
                self.beat()
            o, r, terminated, truncated, info = env.step(env_actions[i])
            ep_return[i] += r
            if terminated or truncated:
                ends.append((i, o, bool(terminated)))
                episode = info.get("episode")  # RecordEpisodeStatistics: the raw score
                if episode is not None:
                    self.ctx.log_episode(float(episode["r"]), int(episode["l"]))
                else:
                    self.ctx.log_episode(ep_return[i], self.t - self.ep_start[i])
                ep_return[i], self.ep_start[i], dones[i] = 0.0, self.t, True
                o, _ = env.reset()
            next_obs.append(o)
            rewards.append(r)
        self.obs = self._tensor(np.stack(next_obs))
        return rewards, dones, ends

    def _advance_pool(self, env_actions: Any) -> tuple[Any, Any, list]:
        obs, rewards, terminated, truncated, info = self.pool.step(env_actions)
        raw = info.get("reward", rewards)  # Atari: the score; ``rewards`` are clipped
        self.t += 1
        ep_return = self.ep_return
        done = terminated | truncated
        obs = obs.copy()  # the rollout keeps it: never a view of the pool's own buffer
        for i, r in enumerate(raw.tolist()):
            ep_return[i] += r
        ids = np.flatnonzero(done)
        ends = [(int(i), obs[i].copy(), bool(terminated[i])) for i in ids]
        for i in ids:
            self.ctx.log_episode(ep_return[i], self.t - self.ep_start[i])
            ep_return[i], self.ep_start[i] = 0.0, self.t
        if ids.size:  # EnvPool resets on the next step: do it now, for those envs alone
            fresh, *_, again = self.pool.step(env_actions[ids], env_id=ids)
            obs[again["env_id"]] = fresh
        self.obs = self._tensor(obs)
        return rewards.astype(np.float32), done, ends

    def _learned(
        self,
        model: ActorCritic,
        rewards: Any,
        dones: Any,
        cut: list[tuple[int, np.ndarray]],
        state: torch.Tensor | None,
    ) -> tuple[Any, Any]:
        """The rewards learned from: scaled (``normalize_reward``), then, where a time limit
        stopped an episode (not a failure), the discounted value of where it stopped added."""
        if self.return_norm is None and not cut:
            return rewards, dones  # the common step: the env's rewards as they are
        rewards = np.array(rewards, dtype=np.float32)
        if self.return_norm is not None:
            rewards = self.return_norm(rewards, np.asarray(dones, dtype=bool))
        if cut:
            ids = [i for i, _ in cut]
            last = self._tensor(np.stack([o for _, o in cut]))
            values = self.bootstrap(model, last, None if state is None else state[:, ids])
            for i, value in zip(ids, values.tolist(), strict=True):
                rewards[i] += self.gamma * value
        return rewards, dones

    def bootstrap(
        self, model: ActorCritic, obs: torch.Tensor, state: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The values ``[k]`` of observations ``obs`` ``[k, ...]``: the last ones of episodes a
        time limit stopped, whose value the step adds, times ``gamma``, to their last reward
        (the return the time limit cut off). A recurrent model values each with ``state``
        ``[rows, k, size]``, the state its env's last step left."""
        with torch.no_grad():
            if state is None:
                return model.value(obs)
            return model.step(obs, state)[1]  # type: ignore[operator]

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=self.dtype)

    def rollout(self, model: ActorCritic, slot: dict[str, torch.Tensor]) -> None:
        """Act with ``model`` for as many steps as ``slot`` holds (one batched forward per step)
        and write the rollout into it in place: the fields of :func:`rollout_spec`.

        With a recurrent model (:class:`mprl.lib.recurrent.RecurrentActorCritic`; ``slot`` has
        a ``state`` then) the state each env's step leaves is carried to its next step, zeroed
        where its episode ended, and kept in ``self.state`` for the next rollout; the state at
        the rollout's start goes to ``slot["state"]``. A fresh EnvBatch (a new or restarted
        worker, a resumed run) starts from zero states."""
        steps = slot["action"].shape[0]
        state = None
        if "state" in slot:
            state = self.state if self.state is not None else model.initial_state(self.n)
            slot["state"].copy_(state)
        obs, actions, logps, rewards, dones = [], [], [], [], []
        for _ in range(steps):
            with torch.no_grad():
                if state is None:
                    out = model.policy(self.obs)  # acting needs the policy head only
                else:
                    out, _, state = model.step(self.obs, state)  # type: ignore[operator]
                action = model.sample(out)
                logp, _ = model.log_prob_entropy(out, action)
            obs.append(self.obs)
            actions.append(action)
            logps.append(logp)
            reward, done, ended = self._step(model, action, state)
            if state is not None and ended:  # a new episode starts from a zero state
                live = torch.ones(self.n)
                live[ended] = 0.0
                state = state * live.unsqueeze(-1)
            self.beat()
            rewards.append(reward)
            dones.append(done)
        obs.append(self.obs)
        self.state = state
        # one write per field and rollout, not one per step
        torch.stack(obs, out=slot["obs"])
        torch.stack(actions, out=slot["action"])
        torch.stack(logps, out=slot["logp"])
        slot["reward"].numpy()[:] = rewards
        slot["done"].numpy()[:] = dones
        self.ctx.add_steps(steps * self.n)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        if self.pool is not None:
            self.pool.close()
