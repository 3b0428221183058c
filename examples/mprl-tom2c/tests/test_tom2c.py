"""The ToM2C example's own tests: the ToM targets, the model's shapes, and serial runs in the
test's process (``pytest`` in examples/mprl-tom2c, the plugin installed)."""

from __future__ import annotations

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


@pytest.mark.parametrize("comm", [True, False])
@pytest.mark.parametrize("agents", [2, 3, 4])
def test_the_model_shapes_and_its_two_parameter_groups(agents: int, comm: bool) -> None:
    env = make_env(f"{ENV}(N={agents})")
    cfg = mprl_tom2c.Config(hidden=16, tom_hidden=8, comm=comm)
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, cfg)
    a, p, batch = agents, agents - 1, 5
    obs = torch.randn(batch, a, env.observation_space.shape[1])
    memory = model.initial(batch)
    assert memory.h.shape == (batch, a, 16) and memory.g.shape == (batch, a, p, 8)
    step = model.step(obs, memory, 0)
    assert step.logits.shape == (batch, a, 5) and step.tom_logits.shape == (batch, a, p, agents)
    assert step.goal_logits.shape == (batch, a, agents) and step.goal.shape == (batch, a)
    assert step.send.shape == (batch, a, p) and step.memory.h.shape == memory.h.shape
    assert step.memory.g.shape == memory.g.shape
    assert step.log_prob(step.goal).shape == (batch, a)
    assert (step.send_logits is not None) == comm and (comm or not step.send.any())
    steps = model.unroll(torch.randn(7, batch, a, obs.shape[-1]))
    assert len(steps) == 7 and steps[-1].logits.shape == (batch, a, 5)
    assert model.value(torch.randn(7, batch, env.observation_space.state.shape[0])).shape == (
        7, batch, a,
    )  # fmt: skip
    policy = {id(x) for x in model.policy_parameters()}
    tom_params = {id(x) for x in model.tom.parameters()}
    assert not policy & tom_params and policy | tom_params == {id(x) for x in model.parameters()}


def test_a_message_reaches_only_the_agent_it_was_sent_to_with_the_senders_goal() -> None:
    goal = torch.tensor([[2, 0, 1]])  # the goals the three agents pursue
    send = torch.zeros(1, 3, 2)
    send[0, 0, 1] = 1.0  # agent 0 to its second other: agent 2
    send[0, 1, 0] = 1.0  # agent 1 to its first other: agent 0
    got = mprl_tom2c.received(send, goal, 3)
    assert got.shape == (1, 3, 2, 4)  # receiver, its others in its order, (sent, goal one-hot)
    assert got[0, 0].tolist() == [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # from 1: goal 0
    assert got[0, 1].sum() == 0  # nobody sent to agent 1
    assert got[0, 2].tolist() == [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]  # from 0: goal 2


def test_what_an_agent_receives_changes_its_move_and_nothing_else_of_its_step() -> None:
    env = make_env()
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, mprl_tom2c.Config())
    for p in model.actor.parameters():  # (its last layer starts near zero)
        torch.nn.init.normal_(p)
    obs, memory = torch.randn(1, 3, 18), model.initial(1)
    goal = torch.tensor([[0, 1, 2]])
    silent = model.step(obs, memory, 0, goal, torch.zeros(1, 3, 2))
    told = model.step(obs, memory, 0, goal, torch.tensor([[[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]]))
    # agent 0 told agent 1: agent 1's move changes; agents 0 and 2 and every ToM are the same
    assert not torch.allclose(silent.logits[0, 1], told.logits[0, 1])
    assert torch.equal(silent.logits[0, [0, 2]], told.logits[0, [0, 2]])
    assert torch.equal(silent.tom_logits, told.tom_logits)


class _Ctx:
    """What ``Episodes`` uses of a worker's context."""

    def __init__(self) -> None:
        self.episodes: list[tuple[float, int]] = []

    def make_env(self, index: int):
        return make_env()

    def should_stop(self) -> bool:
        return False

    def log_episode(self, episode_return: float, length: int, **per_agent: float) -> None:
        self.episodes.append((episode_return, length))


def test_an_episodes_goal_bonus_is_the_distance_closed_to_its_last_goal_whatever_the_switches():
    """The bonus is potential-based on (position, goal): summed over an episode it is the
    distance to the nearest landmark at the start less the distance to the goal pursued at the
    end, so choosing far goals and running between them earns nothing; each message costs
    ``comm_cost``."""
    from mprl.schema import Dims

    cfg = mprl_tom2c.Config(envs_per_worker=2, goal_every=2, comm_cost=0.5)
    env = make_env()
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, cfg)
    dims = Dims(1, env.observation_space, env.action_space, cfg)
    spec = mprl_tom2c.rollout_spec(dims)
    slot = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in spec.items()}
    ctx = _Ctx()
    episodes = mprl_tom2c.Episodes(ctx, cfg)  # type: ignore[arg-type]
    torch.manual_seed(0)
    assert episodes.play(model, slot) == 2 * 25 and len(ctx.episodes) == 2
    obs, goal = slot["obs"], slot["goal"]  # [26, E, A, F], [25, E, A]
    assert (goal[1:] != goal[:-1]).any()  # goals were switched
    start = mprl_tom2c.landmark_offsets(obs[0], 3).norm(dim=-1).min(-1).values
    end = mprl_tom2c.goal_distance(obs[25], goal[24], 3)
    messages = slot["send"].sum((0, -1))  # per env and agent
    torch.testing.assert_close(slot["bonus"].sum(0), start - end - 0.5 * messages)
    assert messages.sum() > 0


def test_eval_plays_each_env_with_its_own_memory_and_a_new_episode_starts_afresh() -> None:
    env = make_env()
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, mprl_tom2c.Config())
    for p in model.actor.parameters():  # (its last layer starts near zero)
        torch.nn.init.normal_(p)
    obs = torch.randn(2, 3, 18)
    first = model.act(obs, deterministic=True)  # step 0 of two envs
    expected = model.step(obs[1:], model.initial(1), 0, greedy=True).logits.argmax(-1)
    assert first.shape == (2, 3) and (first[1] == expected[0].numpy()).all()
    model.act(obs, deterministic=True)
    model.begin_episode(0)  # env 0 starts again, env 1 goes on
    again = model.act(obs, deterministic=True)
    assert (again[0] == first[0]).all()
    assert model._acting[0][1] == 1 and model._acting[1][1] == 3  # steps played
    model.begin_episode(1, playing=False)  # env 1 is done: one row left
    assert model.act(obs[:1]).shape == (1, 3)


def test_the_tom_loss_trains_only_the_tom_nets() -> None:
    env = make_env()
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, mprl_tom2c.Config())
    steps = model.unroll(torch.randn(4, 2, 3, 18))
    torch.stack([s.tom_logits for s in steps]).sum().backward()
    assert all(x.grad is None for x in model.policy_parameters())
    model.zero_grad(set_to_none=True)
    steps = model.unroll(torch.randn(4, 2, 3, 18))
    loss = sum(s.log_prob(s.goal).sum() + s.entropy().sum() for s in steps)
    loss.backward()  # type: ignore[union-attr]
    assert all(x.grad is None for x in model.tom.parameters())
    assert model.sender[0].weight.grad is not None  # the sends are trained by the policy loss


def test_replayed_with_the_workers_goals_and_sends_the_log_probs_are_the_workers() -> None:
    env = make_env()
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, mprl_tom2c.Config())
    obs = torch.randn(12, 4, 3, 18)
    memory = model.initial(4)
    taken, logps = [], []
    with torch.no_grad():
        for t in range(12):  # as a worker plays: goals and sends sampled
            step = model.step(obs[t], memory, t)
            action = torch.distributions.Categorical(logits=step.logits).sample()
            taken.append((step.goal, step.send, action))
            logps.append(step.log_prob(action))
            memory = step.memory
        goal, send, action = (torch.stack(x) for x in zip(*taken, strict=True))
        replayed = model.unroll(obs, goal, send)
    again = torch.stack([s.log_prob(a) for s, a in zip(replayed, action, strict=True)])
    torch.testing.assert_close(again, torch.stack(logps))
    # a goal is chosen every goal_every (5) steps and kept between: only then is it counted
    assert [s.decided for s in replayed] == [t % 5 == 0 for t in range(12)]
    for t in range(12):
        if t % 5:
            assert torch.equal(goal[t], goal[t - 1])


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
    # messages per team step: at most one to each other agent from each agent (3 x 2)
    assert all(0.0 < r["messages_per_step"] <= 6.0 for r in updates)
    assert all(r["message_rate"] == pytest.approx(r["messages_per_step"] / 6) for r in updates)
    assert set(state.train_modes) <= {mprl_tom2c.COLLECTING, mprl_tom2c.WAITING}
    per_agent = [r for r in result.records if "return_agent_2" in r]
    assert len(per_agent) == summary.episodes


def _heading_to_goals(rng: np.random.Generator, teams: int, steps: int = 10):
    """Episodes of 3 agents that each walk straight to a landmark of their own choosing:
    ``obs [T, B, 3, 18]`` and the goals ``[T, B, 3]``."""
    obs = np.zeros((steps, teams, 3, 18), np.float32)
    goals = rng.integers(0, 3, size=(teams, 3))
    for b in range(teams):
        landmarks, pos = rng.uniform(-1, 1, (3, 2)), rng.uniform(-1, 1, (3, 2))
        for t in range(steps):
            obs[t, b] = observation(pos, landmarks)
            way = landmarks[goals[b]] - pos
            pos = pos + 0.08 * way / np.maximum(np.linalg.norm(way, axis=1, keepdims=True), 0.08)
    return torch.as_tensor(obs), torch.as_tensor(goals).expand(steps, teams, 3)


def test_the_tom_learns_the_goals_others_pursue_from_how_they_move() -> None:
    """Trained as the learner trains it (``tom_terms``, optimizer ``ToM``) on agents that walk
    to the landmarks they chose, the ToM names the goal of another agent it sees walking well
    above chance (1/3), and above the guess "the landmark nearest to it now"."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    env = make_env()
    model = mprl_tom2c.make_model(env.observation_space, env.action_space, mprl_tom2c.Config())
    optimizer = mprl_tom2c.make_tom_optimizer(model, mprl_tom2c.Config())

    def terms(obs, goals):
        data = {"obs": obs, "mask": torch.ones(obs.shape[:2]),
                "tom_target": mprl_tom2c.tom_targets(goals)}  # fmt: skip
        steps = model.unroll(obs, goals, torch.zeros(*goals.shape, 2))
        return mprl_tom2c.tom_terms(torch.stack([s.tom_logits for s in steps]), data, 3)

    batches = [_heading_to_goals(rng, 64) for _ in range(8)]
    for i in range(300):
        loss, *_ = terms(*batches[i % 8])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        _, accuracy, nearest = terms(*_heading_to_goals(rng, 64))
    # (about 0.62 against 0.47; nothing tells the goals apart at an episode's first step)
    assert accuracy > 0.55 and accuracy > nearest + 0.08, (accuracy, nearest)
