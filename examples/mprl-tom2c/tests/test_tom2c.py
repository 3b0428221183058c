"""The ToM2C example's own tests: the ToM targets, the model's shapes, and serial runs in the
test's process (``pytest`` in examples/mprl-tom2c, the plugin installed)."""

from __future__ import annotations

import statistics

import mprl_tom2c
import numpy as np
import pytest
import torch

from mprl.testing import plugin_manager, registered

ENV = "mpe2:simple_spread_v3"
CONTROL_STATE = {
    "train_modes", "n_iters", "curr_env_steps", "ToM_count", "ToM_history", "Policy_history",
    "step_history", "loss_history",
}  # fmt: skip


def make_env(env_id: str = ENV):
    from mprl.host.envs import make_env as make

    return make(plugin_manager(), env_id)


def observation(pos: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """simple_spread's observations of agents at ``pos [A, 2]``: velocity 0, no messages."""
    rows = []
    for i, p in enumerate(pos):
        others = [pos[j] - p for j in range(len(pos)) if j != i]
        comm = np.zeros(2 * (len(pos) - 1))
        rows.append(np.concatenate([[0.0, 0.0], p, *(landmarks - p), *others, comm]))
    return np.array(rows, np.float32)


def test_registers_a_multi_agent_algorithm_with_two_named_optimizers() -> None:
    algo = registered(mprl_tom2c)["tom2c"]
    assert algo.agents == "multi" and algo.default_env == ENV
    assert algo.worker is mprl_tom2c.worker and algo.train is mprl_tom2c.train
    assert set(algo.optimizers) == {"Policy", "ToM"}
    assert CONTROL_STATE | {"rollouts", "weights", "lock"} == set(algo.schema.fields)


def test_the_goal_of_each_agent_is_the_landmark_it_is_nearest_to() -> None:
    landmarks = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    pos = np.array([[0.9, 0.2], [0.1, 0.8], [-0.1, -0.1]])  # near landmarks 1, 2, 0
    obs = torch.as_tensor(observation(pos, landmarks))
    goals = mprl_tom2c.nearest_landmark(obs, 3)
    assert goals.tolist() == [1, 2, 0]
    # each agent infers the goals of the others, in the order it observes them
    assert mprl_tom2c.tom_targets(goals).tolist() == [[2, 0], [1, 0], [1, 2]]
    assert mprl_tom2c.others_index(3).tolist() == [[1, 2], [0, 2], [0, 1]]


def test_pair_features_place_the_landmarks_around_the_other_agent() -> None:
    landmarks = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    pos = np.array([[0.9, 0.2], [0.1, 0.8], [-0.1, -0.1]])
    pairs = mprl_tom2c.pair_features(torch.as_tensor(observation(pos, landmarks)), 3)
    assert pairs.shape == (3, 2, 2 + 3 * 3)
    # agent 0's view of agent 2: where agent 2 is, the landmarks from agent 2, their distances
    rel, offsets, dists = pairs[0, 1, :2], pairs[0, 1, 2:8], pairs[0, 1, 8:]
    assert torch.allclose(rel, torch.tensor([-1.0, -0.3]))
    assert torch.allclose(offsets, torch.tensor((landmarks - pos[2]).ravel(), dtype=torch.float32))
    assert torch.allclose(dists, torch.tensor(np.linalg.norm(landmarks - pos[2], axis=1)).float())


def test_the_goals_read_from_an_observation_are_the_worlds() -> None:
    env = make_env(f"{ENV}(N=4)")
    obs, _ = env.reset(seed=3)
    for _ in range(10):
        obs, *_ = env.step(env.action_space.sample())
    world = env.env.unwrapped.world
    lms = np.array([lm.state.p_pos for lm in world.landmarks])
    truth = [int(np.linalg.norm(lms - a.state.p_pos, axis=1).argmin()) for a in world.agents]
    assert mprl_tom2c.nearest_landmark(torch.as_tensor(obs), 4).tolist() == truth


@pytest.mark.parametrize("agents", [2, 3, 4])
def test_the_model_shapes_and_its_two_parameter_groups(agents: int) -> None:
    env = make_env(f"{ENV}(N={agents})")
    cfg = mprl_tom2c.Config(hidden=16, tom_hidden=8)
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, cfg)
    a, p, batch = agents, agents - 1, 5
    obs = torch.randn(batch, a, env.observation_space.shape[1])
    h, g = model.initial(batch)
    assert h.shape == (batch, a, 16) and g.shape == (batch, a, p, 8)
    logits, tom, h2, g2 = model.step(obs, h, g)
    assert logits.shape == (batch, a, 5) and tom.shape == (batch, a, p, agents)
    assert h2.shape == h.shape and g2.shape == g.shape
    logits, tom = model.unroll(torch.randn(7, batch, a, obs.shape[-1]))
    assert logits.shape == (7, batch, a, 5) and tom.shape == (7, batch, a, p, agents)
    assert model.value(torch.randn(7, batch, env.observation_space.state.shape[0])).shape == (
        7, batch, a,
    )  # fmt: skip
    policy = {id(x) for x in model.policy_parameters()}
    tom_params = {id(x) for x in model.tom.parameters()}
    assert not policy & tom_params and policy | tom_params == {id(x) for x in model.parameters()}


def test_the_tom_loss_trains_only_the_tom_nets() -> None:
    env = make_env()
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, mprl_tom2c.Config())
    logits, tom = model.unroll(torch.randn(4, 2, 3, 18))
    tom.sum().backward()
    assert all(x.grad is None for x in model.policy_parameters())
    model.zero_grad(set_to_none=True)
    logits, tom = model.unroll(torch.randn(4, 2, 3, 18))
    logits.sum().backward()
    assert all(x.grad is None for x in model.tom.parameters())


def test_a_checkpoint_of_the_returns_moments_in_one_buffer_still_loads() -> None:
    """Before mprl.lib.norms.ValueNorm the model kept them as ``ret_moments`` ``[mean, var,
    count]``: such a state dict loads, and the critic's values come back as the same returns."""
    env = make_env()
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, mprl_tom2c.Config())
    old = {k: v for k, v in model.state_dict().items() if not k.startswith("value_norm.")}
    old["ret_moments"] = torch.tensor([2.0, 9.0, 50.0])
    loaded = mprl_tom2c.make_model(env.observation_space, env.action_space, mprl_tom2c.Config())
    loaded.load_state_dict(old)  # strict
    state = torch.randn(4, env.observation_space.state.shape[0])
    with torch.no_grad():
        values, returns = model.value(state), loaded.value_norm.denormalize(loaded.value(state))
    torch.testing.assert_close(returns, values * 3.0 + 2.0)


def test_advantages_bootstrap_a_cut_episode_and_stop_at_a_terminal_one() -> None:
    reward = torch.ones(3, 2, 1)
    value = torch.full((4, 2, 1), 10.0)
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])  # lengths 2 and 3
    terminal = torch.tensor([1.0, 0.0])
    adv = mprl_tom2c.advantages(reward, value, mask, terminal, gamma=0.5, lam=1.0)
    # episode 0 terminates after step 1: returns 1.5, 1 -> advantages -8.5, -9; nothing after
    assert adv[:, 0, 0].tolist() == [-8.5, -9.0, 0.0]
    # episode 1 is cut after step 2: returns 3, 4, 6 (1 + 0.5 * 10 at the cut)
    assert adv[:, 1, 0].tolist() == [-7.0, -6.0, -4.0]


def test_tom2c_refuses_an_env_it_cannot_read() -> None:
    env = make_env(f"{ENV}(N=3)")
    with pytest.raises(mprl_tom2c.ConfigError, match="Cooperative Navigation"):
        mprl_tom2c.make_model(
            env.observation_space, env.action_space, mprl_tom2c.Config(landmarks=9)
        )


def test_a_serial_run_trains_both_heads_and_keeps_the_control_state(mprl_pm, mprl_serial) -> None:
    mprl_pm.register(mprl_tom2c)
    result = mprl_serial(
        "tom2c", workers=2, total_steps=2000, seed=1, config={"envs_per_worker": 4}
    )
    state, summary = result.state, result.summary
    assert summary.status == "finished" and summary.stop_reason == "total steps reached"
    assert sum(state.curr_env_steps) == summary.env_steps and min(state.curr_env_steps) > 0
    assert sum(state.n_iters) == summary.episodes // 4
    assert state.ToM_count[0] == state.n_iters[0] * 4 * 3 * 2  # episodes x agents x others
    updates = [r for r in result.records if "tom_accuracy" in r]
    assert len(updates) == len(state.loss_history) == len(state.ToM_history) > 0
    assert [r["tom_loss"] for r in updates] == list(state.ToM_history)
    assert [r["policy_loss"] for r in updates] == list(state.Policy_history)
    assert list(state.step_history) == sorted(state.step_history)
    assert all(0.0 <= r["tom_accuracy"] <= 1.0 and r["tom_chance"] == 1 / 3 for r in updates)
    assert set(state.train_modes) <= {mprl_tom2c.COLLECTING, mprl_tom2c.WAITING}
    per_agent = [r for r in result.records if "return_agent_2" in r]
    assert len(per_agent) == summary.episodes


def test_the_tom_learns_above_chance(mprl_pm, mprl_serial) -> None:
    mprl_pm.register(mprl_tom2c)
    result = mprl_serial("tom2c", workers=2, total_steps=10_000, seed=0)
    accuracy = [r["tom_accuracy"] for r in result.records if "tom_accuracy" in r]
    # chance is 1/3: three landmarks; measured on each batch before the ToM trains on it
    assert statistics.fmean(accuracy[-5:]) > 0.45, accuracy
