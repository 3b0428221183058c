"""mprl.lib.offpolicy: batched acting into a replay buffer (one-step and n-step rows, the
off-policy time-limit bootstrap, seeding and episodes as EnvBatch has them), epsilon-greedy
actions and the linear schedule."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from mprl.context import derive_seed
from mprl.lib.offpolicy import ReplayCollector, epsilon_greedy, linear_schedule


class Chain(gym.Env):
    """Observation ``[t + offset]``, reward ``t + 1 + offset`` for the ``t``-th step; the
    episode ends after ``length`` steps, terminated or (``terminal=False``) cut by a time
    limit."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int, terminal: bool, offset: float = 0.0) -> None:
        self.length, self.terminal, self.offset, self.t = length, terminal, offset, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.t = 0
        return np.array([self.offset], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = self.t + 1 + self.offset
        self.t += 1
        end = self.t >= self.length
        obs = np.array([self.t + self.offset], np.float32)
        return obs, reward, end and self.terminal, end and not self.terminal, {}


class Ctx:
    """What the collector uses of a worker's Context."""

    def __init__(self, envs: list[Chain]) -> None:
        self.envs, self.seed, self.steps, self.episodes = envs, 7, 0, []

    def make_env(self, index: int = 0) -> gym.Env:
        return self.envs[index]

    def env_seed(self, index: int = 0) -> int:
        return derive_seed(self.seed, index)

    def add_steps(self, n: int) -> None:
        self.steps += n

    def log_episode(self, ret: float, length: int) -> None:
        self.episodes.append((ret, length))


class Replay:
    def __init__(self) -> None:
        self.calls: list[dict[str, torch.Tensor]] = []

    def add(self, **rows: torch.Tensor) -> None:
        self.calls.append({k: v.clone() for k, v in rows.items()})

    def rows(self) -> dict[str, torch.Tensor]:
        return {k: torch.cat([c[k] for c in self.calls]) for k in self.calls[0]}


def test_one_step_rows_bootstrap_a_time_limit_and_not_a_termination():
    ctx, replay = Ctx([Chain(3, terminal=False), Chain(2, terminal=True, offset=10)]), Replay()
    collector = ReplayCollector(ctx, replay, 2, gamma=0.9)
    for _ in range(4):
        assert collector.step(torch.tensor([0, 1])) == 2  # a row per env per step
    rows = replay.rows()
    assert set(rows) == {"obs", "action", "reward", "next_obs", "done"}  # no discount asked
    assert ctx.steps == 8 and len(replay.calls) == 4  # one add per step of both envs
    env0 = {k: v[0::2].squeeze(-1).tolist() for k, v in rows.items()}
    env1 = {k: v[1::2].squeeze(-1).tolist() for k, v in rows.items()}
    # env 0: cut by its time limit after 3 steps: done 0, next_obs where it stopped (3, not
    # the next episode's 0), so the learner's target values it; then a new episode
    assert env0["obs"] == [0, 1, 2, 0] and env0["next_obs"] == [1, 2, 3, 1]
    assert env0["done"] == [0, 0, 0, 0] and env0["reward"] == [1, 2, 3, 1]
    # env 1: terminated after 2 steps: done 1 there
    assert env1["obs"] == [10, 11, 10, 11] and env1["next_obs"] == [11, 12, 11, 12]
    assert env1["done"] == [0, 1, 0, 1] and env1["reward"] == [11, 12, 11, 12]
    assert env1["action"] == [1, 1, 1, 1] and rows["action"].dtype == torch.int64
    assert sorted(ctx.episodes) == [(6.0, 3), (23.0, 2), (23.0, 2)]
    assert collector.obs.tolist() == [[1.0], [10.0]]  # what the next action is for


@pytest.mark.parametrize("terminal", [True, False])
def test_n_step_rows_sum_discounted_rewards_to_the_end_of_an_episode(terminal):
    ctx, replay = Ctx([Chain(5, terminal=terminal)]), Replay()
    collector = ReplayCollector(ctx, replay, 1, gamma=0.5, n_step=3)
    added = [collector.step(torch.tensor([0])) for _ in range(6)]
    assert added == [0, 0, 1, 1, 3, 0]  # 3 steps for the first row; the episode's end: all
    rows = {k: v.squeeze(-1).tolist() for k, v in replay.rows().items()}
    assert rows["obs"] == [0, 1, 2, 3, 4]
    # rewards 1..5: 1 + .5 * 2 + .25 * 3, 2 + .5 * 3 + .25 * 4, then to the episode's end
    assert rows["reward"] == [2.75, 4.5, 6.25, 6.5, 5.0]
    assert rows["next_obs"] == [3, 4, 5, 5, 5]
    assert rows["discount"] == [0.125, 0.125, 0.125, 0.25, 0.5]
    assert rows["done"] == [0, 0, float(terminal), float(terminal), float(terminal)]
    # the next episode starts afresh: its first step is not tied to the last one's
    collector.step(torch.tensor([0]))
    collector.step(torch.tensor([0]))
    assert len(replay.calls) == 4 and replay.calls[-1]["obs"].tolist() == [[0.0]]


def test_n_step_needs_the_discount_field_and_a_horizon():
    with pytest.raises(ValueError, match="nstep_row"):
        ReplayCollector(Ctx([Chain(5, True)]), Replay(), 1, 0.9, n_step=2, discount=False)
    with pytest.raises(ValueError, match="n_step must be >= 1"):
        ReplayCollector(Ctx([Chain(5, True)]), Replay(), 1, 0.9, n_step=0)


def test_collect_acts_on_the_current_observations_and_takes_env_actions_apart():
    ctx, replay = Ctx([Chain(4, True), Chain(4, True, offset=5)]), Replay()
    collector = ReplayCollector(ctx, replay, 2, gamma=0.9, discount=True)
    seen = []

    def act(obs: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
        seen.append(obs.squeeze(-1).tolist())
        return torch.tensor([[0.5], [-0.5]]), np.array([0, 1])  # stored / as the env takes it

    assert collector.collect(act, steps=2) == 4
    assert seen == [[0, 5], [1, 6]]
    rows = replay.rows()
    assert rows["action"].tolist() == [[0.5], [-0.5]] * 2
    assert rows["discount"].tolist() == pytest.approx([0.9] * 4)


def test_epsilon_greedy_and_the_linear_schedule():
    q = torch.tensor([[0.0, 1.0, 0.5]] * 2000)
    assert epsilon_greedy(q, 0.0).tolist() == [1] * 2000
    g = torch.Generator().manual_seed(0)
    actions = epsilon_greedy(q, 0.3, g)
    share = (actions != 1).float().mean().item()
    assert 0.15 < share < 0.25  # 0.3 random, two thirds of those another action
    again = epsilon_greedy(q, 0.3, torch.Generator().manual_seed(0))
    assert torch.equal(actions, again) and actions.dtype == torch.int64
    assert linear_schedule(1.0, 0.04, 8000, 0) == 1.0
    assert linear_schedule(1.0, 0.04, 8000, 4000) == pytest.approx(0.52)
    assert linear_schedule(1.0, 0.04, 8000, 10**6) == 0.04
    assert linear_schedule(1.0, 0.04, 0, 0) == 0.04
